#!/usr/bin/env bash
# The whole test suite: install what is missing, then every test of the workspace
# (Vulkan tests run on lavapipe with the validation layer on).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
cargo test --workspace --no-fail-fast "$@"
