#!/usr/bin/env bash
# Builds one libFuzzer target, tests/fuzz/fuzz_<target>.cpp, with clang's libFuzzer,
# AddressSanitizer and UBSan (-O1), and fuzzes it for a bounded time starting from its committed
# seed corpus tests/fuzz/corpus/<target>/ (copied: new inputs never land in the source tree).
# Any crash, sanitizer report, leak, or input running longer than 10 s fails the run; the input
# that did it is kept as ./fuzz-<target>-crash-* (or -leak-, -timeout-) in the current directory:
# reproduce with `tests/fuzz/run.sh <target> repro <file>`.
#   tests/fuzz/run.sh <target> [seconds=15] [clang++]      e.g. tests/fuzz/run.sh text 600
#   targets: checkpoint indexed_dataset sidecar hf_gpt2 text cli
# The source directory is the one this script lives in (../..), so it runs from any directory.
# Needs clang with libFuzzer (Debian 12: clang + libclang-rt-14-dev, from scripts/setup.sh) and
# the text libraries (utf8proc, xxhash, sentencepiece headers); loom's headers build with clang 14
# (core/error.hpp's source_location fallback). Uses ccache when it is installed (the compile is
# then a cache hit until a header changes). CTest runs each target as fuzz_<target>.
set -euo pipefail
target="${1:?usage: tests/fuzz/run.sh <target> [seconds=15] [clang++]}"
seconds="${2:-15}"; cxx="${3:-clang++}"
[[ "$seconds" == repro ]] && cxx=clang++
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source_file="$src/tests/fuzz/fuzz_$target.cpp"
[[ -f "$source_file" ]] || { echo "run.sh: no fuzz target '$target' (no $source_file); see the header of tests/fuzz/run.sh" >&2; exit 2; }

libs=(); max_len=4096
case "$target" in
  text) libs=(-lutf8proc -lxxhash); max_len=16384 ;;   # long lines: clean/filter/dedup stay linear
  sidecar) libs=(-lutf8proc) ;;
esac

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
launcher=(); command -v ccache > /dev/null && launcher=(ccache)
flags=(-std=c++20 -gline-tables-only -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
start=$(date +%s%N)
"${launcher[@]}" "$cxx" "${flags[@]}" -I"$src/include" -I"$src/tests" -I"$src/examples" -isystem /usr/include/eigen3 \
  -c "$source_file" -o "$work/fuzz.o"
"$cxx" "${flags[@]}" "$work/fuzz.o" "${libs[@]}" -o "$work/fuzz"
echo "fuzz_$target: built in $(( ($(date +%s%N) - start) / 1000000 )) ms"

if [[ "$seconds" == repro ]]; then  # run the given inputs once each, e.g. a crash file
  shift 2
  ASAN_OPTIONS=detect_leaks=1 LOOM_FUZZ_VERBOSE=1 "$work/fuzz" -rss_limit_mb=1024 "$@"
  exit
fi
mkdir -p "$work/corpus"
cp "$src/tests/fuzz/corpus/$target/"* "$work/corpus/"
ASAN_OPTIONS=detect_leaks=1 "$work/fuzz" -max_total_time="$seconds" -rss_limit_mb=1024 -max_len="$max_len" \
  -timeout=10 -print_final_stats=1 -artifact_prefix="$PWD/fuzz-$target-" "$work/corpus" 2>&1 | tail -15
echo "fuzz_$target: no crash in $seconds s"
