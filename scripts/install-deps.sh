#!/usr/bin/env bash
# Installs what vkfuse needs on Debian 12 and is missing: shaderc/glslang (static, for the
# compiler), the Vulkan loader, lavapipe (Vulkan on the CPU) and the validation layers, and a
# Rust toolchain if there is none. Safe to run again: it installs only what is missing.
set -euo pipefail

packages=(libshaderc-dev glslang-dev spirv-tools glslc libvulkan-dev libvulkan1 mesa-vulkan-drivers
          vulkan-tools vulkan-validationlayers gcc g++ pkg-config curl ca-certificates)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "vkfuse: installing system packages: ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "vkfuse: need root or sudo to install ${missing[*]}" >&2; exit 1; }
    sudo=sudo
  fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "vkfuse: no Rust toolchain found; installing one with rustup (https://rustup.rs)"
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
  export PATH="$HOME/.cargo/bin:$PATH"
fi
