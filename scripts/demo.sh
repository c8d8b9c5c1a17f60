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
# Where cargo puts the binaries: CARGO_TARGET_DIR when set, as cargo itself does.
bin=${CARGO_TARGET_DIR:-target}/release
echo "== building (release; a few minutes the first time)"
cargo build --release --bin vkfuse --bin compile-model
echo "== Vulkan devices"
"$bin"/vkfuse devices
echo "== compiling $model"
"$bin"/compile-model "$model" -o "$out/qwen3-tied.vkf"
echo "== decoding: prompt 1,2,3, 16 new tokens, replay (record once, submit per token)"
"$bin"/vkfuse run "$out/qwen3-tied.vkf" --ids 1,2,3 --max-new-tokens 16
echo "== the CPU reference interpreter on the model directory (the oracle): the ids must agree"
"$bin"/vkfuse run "$model" --backend reference --ids 1,2,3 --max-new-tokens 16
echo "== benchmark: the same 64 tokens, unfused and fused, eager and replay"
"$bin"/vkfuse bench "$model" --tokens 64
echo "(Columns: vkfuse bench --help. On lavapipe every kernel runs on the CPU, so these times"
echo " do not show what fusion and replay save on a GPU, and the reference interpreter, a plain"
echo " CPU loop over a tiny model, can be the fastest: docs/perf.md has the H100's figures.)"
