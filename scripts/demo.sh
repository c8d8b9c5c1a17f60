#!/usr/bin/env bash
# The main job: install what is missing, build, compile the bundled fixture model into a
# schedule file, decode with it on the default Vulkan device (lavapipe, Vulkan on the CPU, where
# there is no GPU), and print the benchmark table.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"

model=fixtures/models/qwen3-tied
out=${VKFUSE_OUT:-target/demo}
mkdir -p "$out"
echo "== building (release)"
cargo build --release --quiet --bin vkfuse --bin compile-model
echo "== Vulkan devices"
./target/release/vkfuse devices
echo "== compiling $model"
./target/release/compile-model "$model" -o "$out/qwen3-tied.vkf"
echo "== decoding: prompt 1,2,3, 16 new tokens, replay (record once, submit per token)"
./target/release/vkfuse run "$out/qwen3-tied.vkf" --ids 1,2,3 --max-new-tokens 16
echo "== the CPU reference interpreter on the model directory (the oracle): the ids must agree"
./target/release/vkfuse run "$model" --backend reference --ids 1,2,3 --max-new-tokens 16
echo "== benchmark: the same 64 tokens, unfused and fused, eager and replay"
./target/release/vkfuse bench "$model" --tokens 64
