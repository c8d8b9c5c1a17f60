#!/usr/bin/env bash
# The end-to-end suites on a GPU machine reached through the device tool.
#
#   bash bench/h100-tests.sh prepare   # here: build release test binaries, stage .dev/ and .gl/
#   bash bench/h100-tests.sh device    # there (carry .gl and .dev): unpack the Vulkan loader and
#                                      # validation layer, run the suites with validation on
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
prepare)
  cargo test --release --no-run -p vkfuse-tests -p vkfuse 2>&1 | grep -E "Executable" || true
  rm -rf .dev && mkdir -p .dev/bin
  for t in run_cli eager_counters eager_vs_transformers reference_vs_transformers; do
    cp "$(ls -t target/release/deps/$t-* | grep -v '\.d$' | head -1)" .dev/bin/$t
  done
  cp target/release/vkfuse .dev/bin/ && strip .dev/bin/*
  mkdir -p .gl /tmp/amd64/partial
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  apt-get $o update -q >/dev/null
  (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 vulkan-validationlayers)
  grep -qx '/.gl/' .git/info/exclude 2>/dev/null || printf '/.gl/\n/.dev/\n' >> .git/info/exclude
  echo "staged: carry .gl and .dev, then run: bash bench/h100-tests.sh device"
  ;;
device)
  for f in .gl/lib*.deb; do dpkg -x "$f" /; done
  ldconfig
  mkdir -p /tmp/vl && dpkg -x .gl/vulkan-validationlayers*.deb /tmp/vl
  # The layer's manifest names its library without a path: the loader needs both variables.
  export VK_LAYER_PATH=/tmp/vl/usr/share/vulkan/explicit_layer.d LD_LIBRARY_PATH=/tmp/vl/usr/lib/x86_64-linux-gnu
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  # The test binaries find fixtures and the vkfuse binary where they were built.
  mkdir -p /work && ln -sfn "$PWD" /work/main
  mkdir -p target/release && cp .dev/bin/vkfuse target/release/vkfuse
  .dev/bin/vkfuse devices
  for t in reference_vs_transformers eager_vs_transformers eager_counters run_cli; do
    echo "== $t"; .dev/bin/$t --test-threads 1 --nocapture 2>&1 | grep -vE "XDG"
  done
  for m in qwen3-tied llama-gqa qwen3-next; do
    echo "== eager $m"; .dev/bin/vkfuse run fixtures/models/$m --backend eager --ids 1,2,3 --max-new-tokens 28 --json | tail -1
  done
  ;;
*) echo "usage: bash bench/h100-tests.sh prepare|device" >&2; exit 2 ;;
esac
