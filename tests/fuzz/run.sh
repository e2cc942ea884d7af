#!/usr/bin/env bash
# Builds tests/fuzz/fuzz_checkpoint.cpp with clang's libFuzzer, AddressSanitizer and UBSan, and
# runs it for a bounded time from a small seed corpus (a valid safetensors file, a manifest, a
# ZeRO-1 shard). Any crash, sanitizer report or leak fails the run.
#   tests/fuzz/run.sh <source dir> [seconds=15] [clang++]
# Needs clang with libFuzzer (Debian 12: clang + libclang-rt-14-dev, from scripts/setup.sh); loom's
# headers build with clang 14 (core/error.hpp's source_location fallback). A CTest (fuzz_checkpoint).
set -euo pipefail
src="$1"; seconds="${2:-15}"; cxx="${3:-clang++}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$cxx" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$src/include" -isystem /usr/include/eigen3 "$src/tests/fuzz/fuzz_checkpoint.cpp" -o "$work/fuzz"
mkdir -p "$work/corpus"
python3 - "$work/corpus" <<'PY'
import json, struct, sys, os
out = sys.argv[1]
def st(tensors, meta=None):
    header, data, off = {}, b"", 0
    if meta: header["__metadata__"] = meta
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        data += raw; off += len(raw)
    h = json.dumps(header).encode(); h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data
f32 = struct.pack("<4f", 1, 2, 3, 4)
open(os.path.join(out, "st"), "wb").write(b"\0" + st([("param.wte", "F32", [2, 2], f32)], {"format": "pt"}))
manifest = {"format": "loom.checkpoint", "format_version": 1, "step": 1,
            "files": [{"path": "f.safetensors", "tp": 0, "pp": 0, "dp": 0, "bytes": 16, "xxh3_64": "0000000000000000"}]}
open(os.path.join(out, "manifest"), "wb").write(b"\1" + json.dumps(manifest).encode())
ranges = struct.pack("<3q", 0, 64, 0)
m = struct.pack("<64f", *range(64))
open(os.path.join(out, "shard"), "wb").write(b"\2" + st([("adam_m", "F32", [64], m), ("adam_v", "F32", [64], m),
                                                          ("ranges", "I64", [1, 3], ranges)]))
PY
ASAN_OPTIONS=detect_leaks=1 "$work/fuzz" -max_total_time="$seconds" -rss_limit_mb=1024 -max_len=4096 \
  -print_final_stats=1 "$work/corpus" 2>&1 | tail -15
echo "fuzz_checkpoint: no crash in $seconds s"
