#!/usr/bin/env bash
# The main job: install what is missing, build, and decode with the bundled fixture model.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"

model=fixtures/models/qwen3-tied
echo "== building (release)"
cargo build --release --quiet --bin vkfuse --bin compile-model
echo "== the decode step of $model (trace summary)"
./target/release/compile-model "$model" --emit-trace | grep '^;'
echo "== decoding: prompt 1,2,3, 16 new tokens, CPU reference backend"
./target/release/vkfuse run "$model" --backend reference --ids 1,2,3 --max-new-tokens 16
