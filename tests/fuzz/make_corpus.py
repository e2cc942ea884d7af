#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets, tests/fuzz/corpus/<target>/<seed> (committed;
run again after changing a file format): small valid inputs in each target's input layout (see
the header comment of tests/fuzz/fuzz_<target>.cpp), each under 4 KiB.

    python3 tests/fuzz/make_corpus.py            # rewrites tests/fuzz/corpus/

Check that the seeds are accepted with `tests/fuzz/run.sh <target> repro tests/fuzz/corpus/<target>/*`
(it prints "accepted: ..." or the reason a seed was rejected)."""
import json
import os
import struct
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    assert len(data) < 4096, (target, name, len(data))
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def safetensors(tensors, meta=None):
    """tensors: [(name, dtype, shape, raw bytes)] -> the bytes of a safetensors file."""
    header, data, off = {}, b"", 0
    if meta:
        header["__metadata__"] = meta
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        data += raw
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def split2(first, second):
    return struct.pack("<H", len(first)) + first + second


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def bf16(values):
    return b"".join(struct.pack("<f", v)[2:] for v in values)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def checkpoint():
    four = f32([1, 2, 3, 4])
    put("checkpoint", "safetensors", b"\0" + safetensors([("param.wte", "F32", [2, 2], four)], {"format": "pt"}))
    manifest = {"format": "loom.checkpoint", "format_version": 1, "step": 1,
                "files": [{"path": "f.safetensors", "tp": 0, "pp": 0, "dp": 0, "bytes": 16,
                           "xxh3_64": "2e67a4a6367361c0"}]}
    put("checkpoint", "manifest", b"\1" + json.dumps(manifest).encode())
    ranges = struct.pack("<3q", 0, 64, 0)
    m = f32(range(64))
    put("checkpoint", "shard", b"\2" + safetensors([("adam_m", "F32", [64], m), ("adam_v", "F32", [64], m),
                                                    ("ranges", "I64", [1, 3], ranges)]))
    scalars = {"format": "loom.checkpoint", "format_version": 1, "step": 12, "optimizer_step": 11, "tokens": 4096,
               "model": {"name": "fuzz", "arch": "gpt2", "n_layer": 1, "n_head": 1, "d_model": 2, "max_seq": 2,
                         "vocab": 3, "vocab_padded": 4},
               "layout": {"tp": 1, "pp": 1, "dp": 2, "zero": 1},
               "precision": {"name": "fp16", "storage": "F32", "master": "F32"},
               "loss_scaler": {"enabled": True, "scale": 512.0, "growth_tracker": 7},
               "lr_schedule": {"max_lr": 2e-3, "warmup": 10}, "trainer": {"micro_batch": 8, "seq_len": 2},
               "data": {"kind": 1, "epoch": 0, "index": 96, "seed": 1337}}
    put("checkpoint", "scalars", b"\3" + json.dumps(scalars).encode())


def idx_file(dtype_code, lengths, doc_index, width):
    out = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, dtype_code, len(lengths), len(doc_index))
    out += struct.pack("<%di" % len(lengths), *lengths)
    ptr, at = [], 0
    for n in lengths:
        ptr.append(at)
        at += n * width
    out += struct.pack("<%dq" % len(ptr), *ptr)
    out += struct.pack("<%dq" % len(doc_index), *doc_index)
    return out


def indexed_dataset():
    docs = [[(7 * d + k) % 299 for k in range(9 + d)] + [2] for d in range(4)]  # eod = 2, ids < 300
    tokens = [t for doc in docs for t in doc]
    lengths = [len(doc) for doc in docs]
    for name, code, fmt, width in (("uint16", 8, "H", 2), ("int32", 4, "i", 4), ("uint8", 1, "B", 1)):
        bin_ = struct.pack("<%d%s" % (len(tokens), fmt), *tokens)
        put("indexed_dataset", name, split2(idx_file(code, lengths, list(range(len(docs) + 1)), width), bin_))
    # two sequences per document (Megatron's sentence split), int64 tokens
    halves = [doc[: len(doc) // 2] for doc in docs] + [doc[len(doc) // 2:] for doc in docs]
    seqs = [h for pair in zip(halves[:4], halves[4:]) for h in pair]
    bin_ = struct.pack("<%dq" % sum(map(len, seqs)), *[t for s in seqs for t in s])
    put("indexed_dataset", "int64_sentences", split2(idx_file(5, [len(s) for s in seqs], [0, 2, 4, 6, 8], 8), bin_))


def sidecar():
    norm = {"name": "loom-v2", "version": 2, "remove_invisible": True, "remove_control": True,
            "normalize_spaces": True, "fold_width": True, "nfc": True}
    summary = {"format": "megatron-mmap-indexed-dataset-v1", "bin": "corpus.bin", "idx": "corpus.idx",
               "tokenizer": "corpus.model", "vocab_size": 8000, "eod_id": 2, "dtype": "uint16", "documents": 1200,
               "tokens": 338025, "text_bytes": 1115394, "normalization": norm,
               "stages": [{"stage": "read", "documents_in": 1, "documents_out": 1200, "bytes_in": 1115394,
                           "bytes_out": 1115394, "seconds": 0.01, "note": "1 file"}]}
    put("sidecar", "prepare_data", json.dumps(summary, indent=2).encode() + b"\n")
    old = {k: v for k, v in summary.items() if k not in ("normalization", "stages")}
    put("sidecar", "before_normalization", json.dumps(old).encode())
    custom = dict(old, normalization={"name": "custom", "version": 1, "fold_width": False, "nfc": False})
    put("sidecar", "custom_normalization", json.dumps(custom).encode())


# micro_gpt2 (tests/support/host_model.hpp): C = 2, one layer, vocab 3 (padded 4), 2 positions.
C, L, V, VP, S, H = 2, 1, 3, 4, 2, 8


def hf_gpt2():
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V, "n_positions": S,
              "n_ctx": S, "n_embd": C, "n_layer": L, "n_head": 1, "n_inner": None, "activation_function": "gelu_new",
              "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
    shapes = [("wte.weight", [V, C]), ("wpe.weight", [S, C]), ("h.0.ln_1.weight", [C]), ("h.0.ln_1.bias", [C]),
              ("h.0.attn.c_attn.weight", [C, 3 * C]), ("h.0.attn.c_attn.bias", [3 * C]),
              ("h.0.attn.c_proj.weight", [C, C]), ("h.0.attn.c_proj.bias", [C]), ("h.0.ln_2.weight", [C]),
              ("h.0.ln_2.bias", [C]), ("h.0.mlp.c_fc.weight", [C, H]), ("h.0.mlp.c_fc.bias", [H]),
              ("h.0.mlp.c_proj.weight", [H, C]), ("h.0.mlp.c_proj.bias", [C]), ("ln_f.weight", [C]),
              ("ln_f.bias", [C])]
    cfg = json.dumps(config).encode()
    vals = lambda shape, k: [0.25 * ((i + k) % 7) - 0.5 for i in range(numel(shape))]
    t32 = [(n, "F32", s, f32(vals(s, k))) for k, (n, s) in enumerate(shapes)]
    put("hf_gpt2", "import_f32", b"\0" + split2(cfg, safetensors(t32, {"format": "pt"})))
    t16 = [("transformer." + n, "BF16", s, bf16(vals(s, k))) for k, (n, s) in enumerate(shapes)]
    put("hf_gpt2", "import_bf16_prefixed", b"\0" + split2(cfg, safetensors(t16, {"format": "pt"})))
    # loom's own weights file (io::save_weights): the parameter table's names and shapes
    table = [("wte", [VP, C]), ("wpe", [S, C]), ("ln1_w", [L, C]), ("ln1_b", [L, C]), ("qkv_w", [L, 3 * C, C]),
             ("qkv_b", [L, 3 * C]), ("attproj_w", [L, C, C]), ("attproj_b", [L, C]), ("ln2_w", [L, C]),
             ("ln2_b", [L, C]), ("fc_w", [L, H, C]), ("fc_b", [L, H]), ("fcproj_w", [L, C, H]), ("fcproj_b", [L, C]),
             ("lnf_w", [C]), ("lnf_b", [C])]
    meta = {"format": "loom.weights.v1", "model": "micro_gpt2", "n_layer": str(L), "n_head": "1", "d_model": str(C),
            "max_seq": str(S), "vocab": str(V), "vocab_padded": str(VP), "arch": "gpt2"}
    weights = safetensors([(n, "F32", s, f32(vals(s, k))) for k, (n, s) in enumerate(table)], meta)
    put("hf_gpt2", "loom_weights", b"\1" + split2(b"", weights))


def text():
    docs = {
        "html": (0x7F, 0x00, "<html><body><p class=\"x\">Hello &amp; welcome</p><script>var a = '<b>';</script>"
                             "<!-- note --><br/>a &lt; b &#39;q&#x4e2d;</body></html>"),
        "cjk_width": (0x3F, 0x00, "你好，世界！ Hello，world！ ＧＰＴ－２\u3000ok\u00a0nbsp"),
        "invisible": (0xFF, 0x02, "zero\u200bwidth \ufeffbom soft\u00adhyphen e\u0301 \U0001F468\u200d\U0001F469 \ue000"),
        "controls": (0x7F, 0x01, "line\r\nnext\rlast\u2028sep\x01\x7f tab\t end   "),
    }
    for name, (a, b, s) in docs.items():
        put("text", name, bytes([a, b]) + s.encode("utf-8"))
    invalid = b"ok \xc0\xaf overlong \xed\xa0\x80 surrogate \xf4\x90\x80\x80 too big \xe4\xbd truncated \x80 stray"
    put("text", "invalid_utf8", bytes([0xFF, 0x10]) + invalid)
    put("text", "scripts", bytes([0x40, 0xD0]) + "latin,han,cyrillic".encode())


def cli():
    def args(*a, dataset=False):  # byte 0: whether --data names a dataset
        return (b"\1" if dataset else b"\0") + b"\0".join(x.encode() for x in a)
    put("cli", "quickstart", args("--data", "in.txt", "--steps", "300"))
    put("cli", "layout", args("--data", "in.txt", "--model", "char_tiny", "--layout", "tp2pp2", "--ranks", "4",
                              "--grad-accum", "4", "--precision", "bf16"))
    put("cli", "dataset", args("--data", "out/shakespeare", "--eval-every", "100", "--early-stop", "3",
                               "--steps", "600", "--profile-steps", "5:9", "--dropout", "0.1", dataset=True))
    put("cli", "data_parallel", args("--data", "in.txt", "--ranks", "2", "--zero1", "--bucket-mb", "0.5",
                                     "--comm-timeout", "30", "--replica-check-every", "10", "--no-overlap"))
    put("cli", "checkpoints", args("--data", "in.txt", "--checkpoint-dir", "ckpt", "--save-every", "50", "--keep", "2",
                                   "--stop-at-step", "100", "--out", "w.safetensors", "--seed", "7",
                                   "--temperature", "0.9", "--top-k", "40", "--lr", "1e-3", "--warmup", "20"))
    put("cli", "megatron", args("--data-path", "out/shakespeare", "--train-iters", "100", "--micro-batch-size", "4",
                                "--global-batch-size", "16", "--lr-decay-style", "constant", "--lr-warmup-fraction",
                                "0.01", "--adam-beta2", "0.999", "--bf16", "--save", "ckpt", "--load", "ckpt",
                                "--save-interval", "50", "--tensor-model-parallel-size", "2",
                                "--recompute-granularity", "full", "--use-flash-attn", dataset=True))


if __name__ == "__main__":
    for make in (checkpoint, indexed_dataset, sidecar, hf_gpt2, text, cli):
        make()
    print("wrote", ROOT, file=sys.stderr)
