#!/usr/bin/env bash
# Builds loom's tests and examples under sanitizers (-DLOOM_SANITIZE=..., CMakeLists.txt) in a
# build directory of their own and runs them:
#   scripts/sanitize.sh [address]    build-asan/: AddressSanitizer + UBSan (leaks included) over the
#                                    unit, Ascend-emulation and CLI tests (ctest -L 'unit|ascend|cli',
#                                    without the compile-fail, package and MPI tests)
#   scripts/sanitize.sh thread       build-tsan/: ThreadSanitizer over the threads communicator and
#                                    the data/tensor parallelism on it (tests/unit/parallel/*) and the
#                                    prefetching data loader; OpenMP off (libgomp is not
#                                    TSan-instrumented), so the kernels run single-threaded
#   scripts/sanitize.sh address -R safetensors    extra arguments go to ctest
# Every sanitizer report, also from a process a CLI test expects to fail, is written to
# <build>/sanitizer-logs/ (ASAN/UBSAN/TSAN_OPTIONS log_path); the script prints them and exits 1 if
# there are any, otherwise with ctest's status. Reports name file:line (-g1).
# Environment: LOOM_JOBS (build jobs, default: number of cores), LOOM_SANITIZE_BUILD_DIR (default
# build-asan or build-tsan), LOOM_UNIT_FILTER (thread: the tests/unit sources to compile, a regex;
# e.g. 'parallel/|data/test_loader|io/test_checkpoint_parallel' adds the background multi-rank saves).
# Cost on the project's 2-core machine: see docs/reliability.md, section Sanitizers.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

kind="address"
if [[ $# -gt 0 && ( "$1" == "address" || "$1" == "thread" ) ]]; then
  kind="$1"
  shift
elif [[ $# -gt 0 && "$1" != -* ]]; then
  echo "sanitize.sh: unknown sanitizer '$1'; pass address (ASan + UBSan) or thread (TSan), then ctest arguments" >&2
  exit 2
fi
jobs="${LOOM_JOBS:-$(nproc)}"

if [[ "$kind" == "address" ]]; then
  build_dir="${LOOM_SANITIZE_BUILD_DIR:-build-asan}"
  # MPI off: Open MPI's own allocations at exit would be reported as leaks, and the MPI tests
  # (label mpi) are not part of this run.
  config=(-DLOOM_SANITIZE=address,undefined -DLOOM_WITH_MPI=OFF)
  targets=(all)
  select=(-L 'unit|ascend|cli' -LE 'failtest|package|mpi')
else
  build_dir="${LOOM_SANITIZE_BUILD_DIR:-build-tsan}"
  filter="${LOOM_UNIT_FILTER:-parallel/|data/test_loader}"
  config=(-DLOOM_SANITIZE=thread -DLOOM_WITH_MPI=OFF -DLOOM_BUILD_EXAMPLES=OFF -DLOOM_WITH_ASCEND=OFF
          "-DLOOM_UNIT_FILTER=$filter")
  targets=(loom_tests)
  select=(-L unit)
fi

if [[ -f "$build_dir/CMakeCache.txt" ]] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$build_dir/CMakeCache.txt"; then
  echo "sanitize.sh: $build_dir/ was configured with another generator; remove it or set LOOM_SANITIZE_BUILD_DIR" >&2
  exit 1
fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${config[@]}"
cmake --build "$build_dir" -j "$jobs" --target "${targets[@]}"

logs="$PWD/$build_dir/sanitizer-logs"
rm -rf "$logs"
mkdir -p "$logs"
common="log_path=$logs/report:print_stacktrace=1"
export ASAN_OPTIONS="$common:detect_leaks=1:detect_stack_use_after_return=1:strict_string_checks=1"
export UBSAN_OPTIONS="$common:halt_on_error=1"
export TSAN_OPTIONS="$common:halt_on_error=1:second_deadlock_stack=1"

status=0
ctest --test-dir "$build_dir" --output-on-failure -j2 "${select[@]}" "$@" || status=$?

shopt -s nullglob
reports=("$logs"/report*)
if [[ ${#reports[@]} -gt 0 ]]; then
  for r in "${reports[@]}"; do
    echo "=== $r"
    cat "$r"
  done
  echo "sanitize.sh: ${#reports[@]} sanitizer report(s) above, in $logs" >&2
  exit 1
fi
echo "sanitize.sh: no sanitizer report ($kind)"
exit "$status"
