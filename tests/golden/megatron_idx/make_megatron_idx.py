#!/usr/bin/env python3
"""Independent writer and reader of Megatron's mmap indexed dataset (.bin + .idx).

Written from the format description (DESIGN.md section 6) and Megatron-LM's
MMapIndexedDatasetBuilder (megatron/data/indexed_dataset.py; megatron/core/datasets/
indexed_dataset.py), using only the standard library (struct), so it runs without numpy or
torch. loom's C++ code is not used here.

    python3 make_megatron_idx.py write [OUT_DIR]   writes tiny_u16.{bin,idx}, tiny_i32.{bin,idx}
    python3 make_megatron_idx.py dump PREFIX       prints header, lengths, pointers, documents
                                                   and the tokens of every sequence

Builder semantics reproduced exactly:
  * add_item(tokens): appends the tokens (dtype, little-endian, C order) to .bin and the
    length to `sizes`;
  * end_document(): appends len(sizes) to `doc_idx`, which starts as [0];
  * finalize(): .idx = b"MMIDIDX\\x00\\x00" + <Q version 1 + <B dtype code + <Q len(sizes)
    + <Q len(doc_idx) + int32 sizes + int64 byte pointers (running sum of size*itemsize)
    + int64 doc_idx.

The committed files tests/golden/megatron_idx/tiny_*.{bin,idx} are this script's output;
tests/unit/data/test_indexed_dataset.cpp reads them with loom and checks that loom's writer
produces the same bytes for the same documents (DOCUMENTS below, repeated there).
"""
import os
import struct
import sys

HEADER = b"MMIDIDX\x00\x00"
CODES = {"uint8": (1, "B"), "int8": (2, "b"), "int16": (3, "h"), "int32": (4, "i"),
         "int64": (5, "q"), "float64": (6, "d"), "float32": (7, "f"), "uint16": (8, "H")}
BY_CODE = {code: (name, fmt) for name, (code, fmt) in CODES.items()}

# Documents are lists of sequences (Megatron's --split-sentences gives several per document).
# The C++ test holds the same lists.
DOCUMENTS_U16 = [
    [[5, 17, 65535, 0, 2]],            # one sequence, with the largest uint16
    [[300, 301], [302], []],           # three sequences, one of them empty
    [[]],                              # an empty document
    [[7] * 11 + [2]],                  # longer run
]
DOCUMENTS_I32 = [
    [[100000, 2, 70000]],              # ids that need int32
    [[2147483647, 0], [1, 2, 3]],
    [[65536, 65537, 2]],
]


class Builder:
    """Mirror of Megatron's MMapIndexedDatasetBuilder (bin written as items arrive)."""

    def __init__(self, prefix, dtype):
        self.prefix = prefix
        self.dtype = dtype
        self.code, self.fmt = CODES[dtype]
        self.itemsize = struct.calcsize("<" + self.fmt)
        self.data = open(prefix + ".bin", "wb")
        self.sizes = []
        self.doc_idx = [0]

    def add_item(self, tokens):
        self.data.write(struct.pack("<%d%s" % (len(tokens), self.fmt), *tokens))
        self.sizes.append(len(tokens))

    def end_document(self):
        self.doc_idx.append(len(self.sizes))

    def finalize(self):
        self.data.close()
        pointers, address = [], 0
        for size in self.sizes:
            pointers.append(address)
            address += size * self.itemsize
        with open(self.prefix + ".idx", "wb") as f:
            f.write(HEADER)
            f.write(struct.pack("<Q", 1))
            f.write(struct.pack("<B", self.code))
            f.write(struct.pack("<Q", len(self.sizes)))
            f.write(struct.pack("<Q", len(self.doc_idx)))
            f.write(struct.pack("<%di" % len(self.sizes), *self.sizes))
            f.write(struct.pack("<%dq" % len(pointers), *pointers))
            f.write(struct.pack("<%dq" % len(self.doc_idx), *self.doc_idx))


def write(out_dir):
    for name, dtype, docs in (("tiny_u16", "uint16", DOCUMENTS_U16), ("tiny_i32", "int32", DOCUMENTS_I32)):
        b = Builder(os.path.join(out_dir, name), dtype)
        for doc in docs:
            for seq in doc:
                b.add_item(seq)
            b.end_document()
        b.finalize()


def read(prefix):
    """Returns (dtype name, sizes, pointers, doc_idx, sequences) after checking the file."""
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    with open(prefix + ".bin", "rb") as f:
        data = f.read()
    if idx[:9] != HEADER:
        raise ValueError("bad magic")
    (version,) = struct.unpack_from("<Q", idx, 9)
    if version != 1:
        raise ValueError("bad version %d" % version)
    (code,) = struct.unpack_from("<B", idx, 17)
    name, fmt = BY_CODE[code]
    itemsize = struct.calcsize("<" + fmt)
    seq_count, doc_count = struct.unpack_from("<QQ", idx, 18)
    off = 34
    sizes = list(struct.unpack_from("<%di" % seq_count, idx, off))
    off += 4 * seq_count
    pointers = list(struct.unpack_from("<%dq" % seq_count, idx, off))
    off += 8 * seq_count
    doc_idx = list(struct.unpack_from("<%dq" % doc_count, idx, off))
    off += 8 * doc_count
    if off != len(idx):
        raise ValueError("index has %d trailing bytes" % (len(idx) - off))
    seqs = []
    for size, ptr in zip(sizes, pointers):
        if ptr + size * itemsize > len(data):
            raise ValueError("sequence past end of .bin")
        seqs.append(list(struct.unpack_from("<%d%s" % (size, fmt), data, ptr)))
    return name, sizes, pointers, doc_idx, seqs


def dump(prefix):
    name, sizes, pointers, doc_idx, seqs = read(prefix)
    print("dtype", name)
    print("sequences", len(sizes), "documents", len(doc_idx) - 1, "tokens", sum(sizes))
    print("sizes", sizes[:20], "..." if len(sizes) > 20 else "")
    print("pointers", pointers[:20], "..." if len(pointers) > 20 else "")
    print("doc_idx", doc_idx[:21], "..." if len(doc_idx) > 21 else "")
    for i, s in enumerate(seqs[:10]):
        print("seq", i, s[:16], "..." if len(s) > 16 else "")


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "write":
        write(sys.argv[2] if len(sys.argv) > 2 else os.path.dirname(os.path.abspath(__file__)))
    elif len(sys.argv) == 3 and sys.argv[1] == "dump":
        dump(sys.argv[2])
    else:
        print(__doc__)
        sys.exit(2)
