#!/usr/bin/env bash
# Installs the Debian packages kvrelay needs, only those missing.
# CUDA is never installed here (docs/design.md §13): the build uses nvcc if present.
set -euo pipefail

packages=(cmake ninja-build make gcc clang libclang-rt-14-dev pkg-config
          libucx-dev ucx-utils libsodium-dev libcmocka-dev libjansson-dev
          liburing-dev libssl-dev
          iproute2 procps)

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
updated=""

missing_of() {
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
      echo "$p"
    fi
  done
}

# apt_install PKG...: installs them quietly (apt-get update once per run).
apt_install() {
  echo "install-deps: installing $*"
  export DEBIAN_FRONTEND=noninteractive
  if [ -z "$updated" ]; then
    $sudo apt-get update -qq
    updated=1
  fi
  $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

mapfile -t missing < <(missing_of "${packages[@]}")
if [ ${#missing[@]} -gt 0 ]; then
  apt_install "${missing[@]}"
fi

# Python, for the python3 on PATH: numpy and pytest run the package's tests;
# venv (with its bundled pip) lets `pip install ./python` and its test build
# the package in a fresh environment (pip fetches the build backend,
# scikit-build-core, from PyPI). Failure here only skips Python tests.
if command -v python3 >/dev/null 2>&1; then
  if [ "$(command -v python3)" = "/usr/bin/python3" ]; then
    py=()
    python3 -c "import numpy, pytest" >/dev/null 2>&1 ||
      py+=(python3-numpy python3-pytest)
    python3 -c "import ensurepip, venv" >/dev/null 2>&1 || py+=(python3-venv)
    if [ ${#py[@]} -gt 0 ]; then
      apt_install "${py[@]}" ||
        echo "install-deps: ${py[*]} not installed; Python tests will skip"
    fi
  else
    if ! python3 -c "import numpy, pytest" >/dev/null 2>&1; then
      python3 -m pip install -q numpy pytest >/dev/null 2>&1 ||
        echo "install-deps: numpy/pytest not installed; Python tests will skip"
    fi
    python3 -c "import ensurepip, venv" >/dev/null 2>&1 ||
      echo "install-deps: $(command -v python3) has no venv/ensurepip;" \
           "the install test will skip"
  fi
fi
echo "install-deps: all dependencies present"
