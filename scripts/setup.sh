#!/usr/bin/env bash
# Installs every Debian 12 package loom needs to build, test and run its examples.
#   scripts/setup.sh            what loom needs to build and run its programs (the quickstart)
#   scripts/setup.sh --test     also what only the test suite uses (clang for the fuzzers, Chromium)
#   scripts/setup.sh --golden   also python3-torch and python3-numpy (only to regenerate
#                               tests/golden/; the tests themselves never need PyTorch)
# Non-interactive and idempotent: when every package is installed already it does not touch apt.
# Runs as root (CI) or through sudo.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config python3
  libeigen3-dev librange-v3-dev doctest-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin
  libsentencepiece-dev sentencepiece libutf8proc-dev libxxhash-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev libopenblas-dev
  libdnnl-dev ocl-icd-opencl-dev   # oneDNN: the fp32 GEMM behind kernels::cpu::gemm (optional;
                                   # Eigen without it); its CMake config needs the OpenCL headers
)
test_packages=(
  clang libclang-rt-14-dev   # the fuzz_<target> tests (libFuzzer + sanitizers)
  chromium   # the cli_report test's headless screenshot: 115 MB download, ~30 s install
)
for arg in "$@"; do
  case "$arg" in
    --test) packages+=("${test_packages[@]}") ;;
    --golden) packages+=(python3-torch python3-numpy) ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg'; use --test, --golden or nothing" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  # "ii" = wanted install, currently installed; anything else (absent, config-files, half-installed) is missing
  [[ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null)" == ii* ]] || missing+=("$p")
done
if (( ${#missing[@]} == 0 )); then
  echo "setup.sh: all ${#packages[@]} packages are installed"
  exit 0
fi

if (( EUID == 0 )); then
  as_root=()
elif command -v sudo >/dev/null; then
  as_root=(sudo)
else
  echo "setup.sh: need root to install ${missing[*]}; run as root or install sudo" >&2
  exit 1
fi
echo "setup.sh: installing ${missing[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends "${missing[@]}"
