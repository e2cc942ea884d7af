#!/usr/bin/python3
"""A small safetensors file written by Python, for tests/unit/io/test_safetensors.cpp.

Writes tests/golden/io_fixture.safetensors by hand (struct + json; numpy does the F16 rounding,
torch the BF16 rounding, independently of loom's decoders). On purpose it differs from what
loom's writer produces: the header is not padded, keys are sorted by name while the data is
in another order, and tensors are not aligned, so the reader is tested on any valid layout.
Run with the Debian interpreter that has python3-torch:  /usr/bin/python3 make_io_fixture.py
"""
import json
import math
import struct
from pathlib import Path

import numpy as np
import torch


def bf16_bits(values):
    return torch.tensor(values, dtype=torch.float32).to(torch.bfloat16).view(torch.int16).numpy().view("<u2")


TENSORS = [  # (name, dtype, array) in data order
    ("u8", "U8", np.array([0, 200, 255], dtype="<u1")),
    ("f16", "F16", np.array([1.0, -2.5, 65504.0, 2.0 ** -14, 2.0 ** -24, -0.0, math.inf, 1.0 / 3.0],
                            dtype="<f2").reshape(2, 4)),
    ("i64", "I64", np.array([-(2 ** 63), 1, 2 ** 62 + 1], dtype="<i8")),
    ("bf16", "BF16", bf16_bits([1.0, -3.140625, 0.1, 2.0 ** -133, -math.inf])),
    ("f32", "F32", np.array([0.1, -1e-30, 3.4028234663852886e38], dtype="<f4")),
    ("empty", "F32", np.zeros((0, 3), dtype="<f4")),
    ("i32", "I32", np.array([[-(2 ** 31), 7, 2 ** 31 - 1]], dtype="<i4")),
    ("scalar", "F64", np.array(2.5, dtype="<f8")),
    ("u16", "U16", np.array([65535, 1, 300], dtype="<u2")),
    ("f64", "F64", np.array([[math.pi], [-1e-300]], dtype="<f8")),
]
METADATA = {"writer": "tests/golden/make_io_fixture.py", "note": "non-ASCII \u00fcn\u00efc\u00f6de"}


def main():
    header, pos, data = {"__metadata__": METADATA}, 0, b""
    for name, dtype, a in TENSORS:
        raw = a.tobytes(order="C")
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [pos, pos + len(raw)]}
        pos += len(raw)
        data += raw
    text = json.dumps(header, sort_keys=True, ensure_ascii=False).encode("utf-8")  # not padded
    out = Path(__file__).resolve().parent / "io_fixture.safetensors"
    out.write_bytes(struct.pack("<Q", len(text)) + text + data)
    print(f"wrote {out} ({out.stat().st_size} bytes)")
    print("bf16 values:", [float(x) for x in torch.tensor(
        [1.0, -3.140625, 0.1, 2.0 ** -133, -math.inf]).to(torch.bfloat16).float()])
    print("f16 values:", [float(x) for x in TENSORS[1][2].reshape(-1)])


if __name__ == "__main__":
    main()
