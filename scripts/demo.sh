#!/usr/bin/env bash
# The main job: install what is missing, build, and decode with the bundled fixture model on
# the default Vulkan device (lavapipe, Vulkan on the CPU, where there is no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"

model=fixtures/models/qwen3-tied
echo "== building (release)"
cargo build --release --quiet --bin vkfuse --bin compile-model
echo "== the decode step of $model (trace summary)"
./target/release/compile-model "$model" --emit-trace | grep '^;'
echo "== Vulkan devices"
./target/release/vkfuse devices
echo "== decoding on the default Vulkan device: prompt 1,2,3, 16 new tokens, eager backend"
./target/release/vkfuse run "$model" --backend eager --ids 1,2,3 --max-new-tokens 16
echo "== the same with the CPU reference interpreter (the oracle): the ids must agree"
./target/release/vkfuse run "$model" --backend reference --ids 1,2,3 --max-new-tokens 16
