#!/usr/bin/env python3
"""Independent reader of TensorBoard event files (no TensorFlow, no protobuf package).

Written from the format, not from loom's writer:
  * TFRecord framing (tensorflow/core/lib/io/record_writer.cc): u64 length (LE), u32 masked
    CRC-32C of the 8 length bytes, the data, u32 masked CRC-32C of the data;
    masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8 mod 2**32.
  * CRC-32C computed bit by bit here (reflected polynomial 0x82F63B78), deliberately unlike
    loom's table-driven version.
  * Event / Summary / Summary.Value protobufs (tensorflow/core/util/event.proto,
    tensorflow/core/framework/summary.proto), decoded by a generic wire-format parser:
    Event{1: double wall_time, 2: int64 step, 3: string file_version, 5: Summary summary},
    Summary{1: repeated Value value}, Value{1: string tag, 2: float simple_value}.

Usage: read_tfevents.py FILE
Prints one JSON object per record:
  {"wall_time": float, "step": int, "file_version": str?, "scalars": [[tag, value], ...]}
Non-finite values are printed as the strings "nan", "inf", "-inf" (JSON has no NaN).
Exit status 0 if every record's CRCs are valid and every Event parses; 1 otherwise, with
the reason on stderr. Used by tests/unit/io/test_tensorboard.cpp when python3 exists.
"""
import json
import math
import struct
import sys


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_varint(buf: bytes, pos: int):
    result, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def fields(buf: bytes):
    """Yields (field_number, wire_type, value) for one serialized message."""
    pos = 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire == 0:
            value, pos = read_varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = read_varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > len(buf):
            raise ValueError("field runs past the end of its message")
        yield number, wire, value


def decode_event(buf: bytes) -> dict:
    event = {"wall_time": None, "step": 0, "scalars": []}
    for number, wire, value in fields(buf):
        if number == 1 and wire == 1:
            event["wall_time"] = struct.unpack("<d", value)[0]
        elif number == 2 and wire == 0:
            event["step"] = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 3 and wire == 2:
            event["file_version"] = value.decode("utf-8")
        elif number == 5 and wire == 2:
            for vnum, vwire, vbuf in fields(value):
                if vnum != 1 or vwire != 2:
                    continue
                tag, simple = None, None
                for fnum, fwire, fval in fields(vbuf):
                    if fnum == 1 and fwire == 2:
                        tag = fval.decode("utf-8")
                    elif fnum == 2 and fwire == 5:
                        simple = struct.unpack("<f", fval)[0]
                if tag is None or simple is None:
                    raise ValueError("Summary.Value without tag or simple_value")
                event["scalars"].append([tag, simple])
    if event["wall_time"] is None:
        raise ValueError("Event without wall_time")
    return event


def records(data: bytes):
    pos, index = 0, 0
    while pos < len(data):
        if pos + 12 > len(data):
            raise ValueError(f"record {index}: truncated header")
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (len_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if masked(crc32c(header)) != len_crc:
            raise ValueError(f"record {index}: length CRC mismatch")
        start, end = pos + 12, pos + 12 + length
        if end + 4 > len(data):
            raise ValueError(f"record {index}: truncated data")
        payload = data[start:end]
        (data_crc,) = struct.unpack("<I", data[end:end + 4])
        if masked(crc32c(payload)) != data_crc:
            raise ValueError(f"record {index}: data CRC mismatch")
        yield payload
        pos, index = end + 4, index + 1


def jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1], "rb") as f:
        data = f.read()
    try:
        for payload in records(data):
            event = decode_event(payload)
            event["scalars"] = [[t, jsonable(v)] for t, v in event["scalars"]]
            print(json.dumps(event, ensure_ascii=False))
    except ValueError as e:
        print(f"read_tfevents: {sys.argv[1]}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
