#!/usr/bin/env bash
# Builds loom and runs its whole test suite: installs dependencies (scripts/setup.sh), configures
# build/ (Ninja, Release), builds with every core, runs CTest two tests at a time. The benchmarks
# are not built (LOOM_BENCH_IN_ALL=OFF; the bench_syntax test compiles each -fsyntax-only);
# `cmake --build build --target loom_benchmarks` builds them.
#   scripts/test.sh                 everything
#   scripts/test.sh -L unit         extra arguments go to ctest (-R <regex>, -L <label>, ...)
# Environment: LOOM_BUILD_DIR (default build), LOOM_JOBS (default: number of cores).
# Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build_dir="${LOOM_BUILD_DIR:-build}"
jobs="${LOOM_JOBS:-$(nproc)}"

bash scripts/setup.sh --test
if [[ -f "$build_dir/CMakeCache.txt" ]] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$build_dir/CMakeCache.txt"; then
  echo "test.sh: $build_dir/ was configured with another generator; remove it or set LOOM_BUILD_DIR" >&2
  exit 1
fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_BENCH_IN_ALL=OFF -DLOOM_BUILD_TESTS=ON
cmake --build "$build_dir" -j "$jobs"
ctest --test-dir "$build_dir" --output-on-failure -j2 "$@"
