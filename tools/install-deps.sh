#!/usr/bin/env bash
# Installs the Debian packages kvrelay needs, only those missing.
# CUDA is never installed here (docs/design.md §13): the build uses nvcc if present.
set -euo pipefail

packages=(cmake ninja-build make gcc clang libclang-rt-14-dev pkg-config
          libucx-dev ucx-utils libsodium-dev libcmocka-dev libjansson-dev
          iproute2 procps)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python test dependencies for the python3 on PATH (pip, or Debian's packages
# when that python is the system one). Failure here only skips Python tests.
if command -v python3 >/dev/null 2>&1; then
  if ! python3 -c "import numpy, pytest" >/dev/null 2>&1; then
    if [ "$(command -v python3)" = "/usr/bin/python3" ]; then
      ${sudo:-} apt-get install -y -qq python3-numpy python3-pytest >/dev/null || true
    else
      python3 -m pip install -q numpy pytest >/dev/null 2>&1 ||
        echo "install-deps: numpy/pytest not installed; Python tests will skip"
    fi
  fi
fi
echo "install-deps: all dependencies present"
