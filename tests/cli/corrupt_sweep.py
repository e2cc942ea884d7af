#!/usr/bin/env python3
"""The corrupt-input sweep: every file loom's programs read, damaged, must give a clean error.

For each file, the sweep truncates it at N random offsets and flips one random byte (XOR with
a random non-zero value) at M random offsets, one damage per run, then runs the program that
reads the file and classifies what happened:

  error      exit status 1..127 and one line on stderr that names the damaged file
  fallback   a checkpoint: the run says it falls back past the damaged checkpoint, exits 0, and
             its result equals a run resumed from the checkpoint it fell back to
  unchanged  exit 0 and a result identical to the undamaged file's (the damage hit bytes with
             no meaning, e.g. JSON whitespace turned into other whitespace)
  accepted   exit 0 with another result, for inputs that are free-form text written by people
             or other tools, where any bytes are valid input (the corpus given to prepare_data,
             the rank table): allowed only for those
  crash      killed by a signal
  hang       still running after --timeout seconds (killed)
  wrong      exit 0 with another result (a silently different model, sample or data)
  unclear    a failure that is not one line naming the file (a stack trace, several lines, ...)

The sweep fails (exit 1) on any crash, hang, wrong or unclear outcome. It also feeds
prepare_data binary files (its own outputs, weights, random bytes), which must be refused.

Valid files are made once with the real programs: prepare_data (dataset .bin/.idx/.json and the
SentencePiece .model), train_gpt (weights, a Hugging Face export, a checkpoint with ZeRO-1
optimizer shards), and a rank table. Each run gets a fresh copy of the files it may change.

    tests/cli/corrupt_sweep.py --bin build/examples                 # 10 truncations + 10 flips per file
    tests/cli/corrupt_sweep.py --bin build/examples --truncations 2 --flips 2 --seed 7
    tests/cli/corrupt_sweep.py --bin build/examples --only dataset.bin,checkpoint.latest --keep /tmp/sweep

Prints the seed first (pass it back with --seed to repeat a sweep), one line per run, then a
table (file x outcome counts, the markdown of docs/reliability.md). Standard library only.
"""
import argparse
import hashlib
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

# Hand-written or third-party inputs: any bytes may be a valid, different input.
FREE_FORM = {"corpus.txt", "rank_table.json"}
PASSING = {"error", "fallback", "unchanged"}


def run(cmd, timeout, env=None):
    """(status, stdout, stderr); status None on a timeout (the process group is killed)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        return None, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


class Sweep:
    def __init__(self, args):
        self.a = args
        self.bin = os.path.abspath(args.bin)
        self.root = args.keep or tempfile.mkdtemp(prefix="loom_corrupt_")
        os.makedirs(self.root, exist_ok=True)
        self.world = os.path.join(self.root, "world")  # the valid files, never damaged
        self.live = os.path.join(self.root, "live")    # what a run reads: a copy, damaged
        self.env = dict(os.environ, OMP_NUM_THREADS="1")
        self.rows = []       # (file, kind, offset, outcome, detail)
        self.refs = {}       # probe name -> fingerprint of the undamaged run
        self.resume_refs = {}  # checkpoint step -> fingerprint of a run resumed from it

    def tool(self, name):
        return os.path.join(self.bin, name)

    def must(self, cmd, what, env=None):
        status, out, err = run(cmd, self.a.setup_timeout, env or self.env)
        if status != 0:
            sys.exit(f"corrupt_sweep: setup failed ({what}): status {status}\n{out[-2000:]}\n{err[-2000:]}")
        return out

    # --- the valid files ----------------------------------------------------------------------
    def make_world(self):
        w = self.world
        shutil.rmtree(w, ignore_errors=True)
        for d in ("ds", "w", "hf", "ck", "rt"):
            os.makedirs(os.path.join(w, d))
        with open(self.a.corpus, "rb") as f:
            text = f.read(self.a.corpus_bytes)
        with open(os.path.join(w, "corpus.txt"), "wb") as f:
            f.write(text[: text.rfind(b"\n") + 1])
        self.must([self.tool("prepare_data"), "--input", f"{w}/corpus.txt", "--output-prefix", f"{w}/ds/d",
                   "--vocab-size", "400", "--threads", "1"], "prepare_data")
        # a SentencePiece model's weights (sample reads them with the tokenizer they record)
        self.must([self.tool("train_gpt"), *self.bpe_flags(f"{w}/ds/d"), "--steps", "2",
                   "--out", f"{w}/w/bpe.safetensors"], "train_gpt quickstart_bpe")
        # byte-level: a Hugging Face export, and checkpoints at steps 2 and 4 with ZeRO-1 shards, of a
        # 6-step schedule that the resumed runs finish
        self.must([self.tool("train_gpt"), *self.char_flags(f"{w}/corpus.txt"), "--steps", "6", "--stop-at-step", "4",
                   "--ranks", "2", "--zero1", "--checkpoint-dir", f"{w}/ck", "--save-every", "2",
                   "--keep", "2", "--export-hf", f"{w}/hf", "--out", f"{w}/w/char.safetensors"],
                  "train_gpt char_tiny with checkpoints")
        with open(os.path.join(w, "rt", "hccl.json"), "w") as f:
            f.write('{\n  "status": "completed",\n  "version": "1.0",\n  "server_count": "1",\n'
                    '  "server_list": [\n    {\n      "server_id": "node_0",\n      "device": [\n'
                    '        {"device_id": "0", "device_ip": "192.168.1.8", "rank_id": "0"},\n'
                    '        {"device_id": "1", "device_ip": "192.168.1.9", "rank_id": "1"}\n'
                    '      ]\n    }\n  ]\n}\n')

    def common(self):
        return ["--eval-every", "0", "--peak-gflops", "1", "--summary-every", "0", "--log-dir", "",
                "--seed", "5", "--prompt", "ROMEO:"]

    def bpe_flags(self, data):
        return ["--data", data, "--model", "quickstart_bpe", "--micro-batch", "2", "--seq-len", "32",
                "--eval-windows", "2", "--sample-tokens", "8", *self.common()]

    def char_flags(self, data):
        return ["--data", data, "--model", "char_tiny", "--micro-batch", "2", "--seq-len", "32",
                "--eval-windows", "2", "--sample-tokens", "8", *self.common()]

    # --- the programs that read each file, and what their result is -----------------------------
    def files(self):
        """(name, path under world/, probe, the directory a run may change) for every file."""
        ck = "ck/step_00000004"
        return [
            ("corpus.txt", "corpus.txt", "prepare", "."),
            ("dataset.idx", "ds/d.idx", "train_dataset", "ds"),
            ("dataset.bin", "ds/d.bin", "train_dataset", "ds"),
            ("dataset.json", "ds/d.json", "train_dataset", "ds"),
            ("tokenizer.model", "ds/d.model", "train_dataset", "ds"),
            ("tokenizer.model (sample)", "ds/d.model", "sample_tokenizer", "ds"),
            ("weights.safetensors", "w/bpe.safetensors", "sample", "w"),
            ("hf/model.safetensors", "hf/model.safetensors", "init_from_hf", "hf"),
            ("hf/config.json", "hf/config.json", "init_from_hf", "hf"),
            ("checkpoint manifest.json", f"{ck}/manifest.json", "resume", "ck"),
            ("checkpoint model shard", f"{ck}/model-tp00-pp00.safetensors", "resume", "ck"),
            ("checkpoint ZeRO-1 shard", f"{ck}/optim-tp00-pp00-dp01.safetensors", "resume", "ck"),
            ("checkpoint latest", "ck/latest", "resume", "ck"),
            ("rank_table.json", "rt/hccl.json", "doctor", "rt"),
        ]

    def probe(self, name, out_dir):
        """(command, env, fingerprint(stdout) -> str) of probe `name` reading live/."""
        L = self.live
        weights = os.path.join(out_dir, "w.safetensors")

        def trained(stdout):  # the weights written, the final validation and the sample
            if not os.path.exists(weights):
                return "no weights written"
            val = re.findall(r"final validation.*?\| val loss ([0-9.naif]+).*?\| ([0-9.naif]+) bits/byte", stdout)
            return f"{sha(weights)} {val} {stdout.rsplit('sample', 1)[-1][-400:]!r}"

        def printed(stdout):
            return hashlib.sha256(stdout.encode()).hexdigest()[:16]

        if name == "prepare":
            return ([self.tool("prepare_data"), "--input", f"{L}/corpus.txt", "--output-prefix", f"{out_dir}/p",
                     "--vocab-size", "400", "--threads", "1"], self.env,
                    lambda s: sha(f"{out_dir}/p.bin") if os.path.exists(f"{out_dir}/p.bin") else "nothing written")
        if name == "train_dataset":
            return [self.tool("train_gpt"), *self.bpe_flags(f"{L}/ds/d"), "--steps", "2", "--out", weights], self.env, trained
        if name == "sample_tokenizer":
            return ([self.tool("sample"), "--weights", f"{self.world}/w/bpe.safetensors", "--tokenizer", f"{L}/ds/d.model",
                     "--tokens", "24", "--prompt", "ROMEO:", "--seed", "3"], self.env, printed)
        if name == "sample":
            return ([self.tool("sample"), "--weights", f"{L}/w/bpe.safetensors", "--tokens", "24", "--prompt", "ROMEO:",
                     "--seed", "3"], self.env, printed)
        if name == "init_from_hf":
            return ([self.tool("train_gpt"), *self.char_flags(f"{L}/corpus.txt"), "--steps", "1", "--init-from-hf",
                     f"{L}/hf", "--out", weights], self.env, trained)
        if name.startswith("resume"):  # "resume" or "resume:<step directory>"
            target = f"{L}/ck" + (f"/{name.split(':', 1)[1]}" if ":" in name else "")
            # an older step on purpose: its newer checkpoints are moved aside (as the fallback moves the damaged)
            older = ["--discard-newer-checkpoints"] if ":" in name else []
            return ([self.tool("train_gpt"), *self.char_flags(f"{L}/corpus.txt"), "--steps", "6", "--ranks", "2",
                     "--zero1", "--resume", target, *older, "--out", weights], self.env, trained)
        if name == "doctor":
            env = dict(self.env, RANK_TABLE_FILE=f"{L}/rt/hccl.json", RANK_ID="1")

            def table(stdout):
                return "\n".join(l for l in stdout.splitlines() if re.match(r"^(OK|FAIL|--)\s+(RANK_TABLE_FILE|rank)\b", l))
            return [self.tool("doctor"), "--no-peak"], env, table
        raise ValueError(name)

    def fresh_live(self, scope):
        """live/ = world/, copied again where the last run may have changed or damaged it."""
        if not os.path.isdir(self.live):
            shutil.copytree(self.world, self.live)
            return
        if scope == ".":
            shutil.copy2(os.path.join(self.world, "corpus.txt"), os.path.join(self.live, "corpus.txt"))
            return
        shutil.rmtree(os.path.join(self.live, scope))
        shutil.copytree(os.path.join(self.world, scope), os.path.join(self.live, scope))

    def execute(self, probe_name):
        out_dir = os.path.join(self.root, "out")
        shutil.rmtree(out_dir, ignore_errors=True)
        os.makedirs(out_dir)
        cmd, env, fingerprint = self.probe(probe_name, out_dir)
        status, out, err = run(cmd, self.a.timeout, env)
        return status, out, err, (fingerprint(out) if status == 0 else None)

    def reference(self, probe_name, scope):
        if probe_name not in self.refs:
            self.fresh_live(scope)
            status, out, err, fp = self.execute(probe_name)
            if status != 0 and probe_name != "doctor":  # doctor exits 2 without an NPU runtime
                sys.exit(f"corrupt_sweep: the undamaged run of {probe_name} failed: status {status}\n{err[-2000:]}")
            if probe_name == "doctor":
                fp = self.probe("doctor", "")[2](out)
                if "OK    RANK_TABLE_FILE" not in fp:
                    sys.exit(f"corrupt_sweep: doctor does not accept the valid rank table:\n{out}")
            self.refs[probe_name] = fp
        return self.refs[probe_name]

    # --- one damaged run -----------------------------------------------------------------------
    def classify(self, label, rel, probe_name, scope, status, out, err, fp):
        base = os.path.basename(rel)
        lines = [l for l in err.splitlines() if l.strip()]
        if status is None:
            return "hang", f"no exit after {self.a.timeout} s"
        if status < 0:
            return "crash", f"signal {-status}: {' | '.join(lines[-3:])}"
        if probe_name == "doctor":  # exits 2 on a CPU-only machine: read its rank table lines
            fp = self.probe("doctor", "")[2](out)
            fails = [l for l in fp.splitlines() if l.startswith("FAIL")]
            if fails:
                return ("error" if base in fails[0] else "unclear"), fails[0]
            if fp == self.refs[probe_name]:
                return "unchanged", ""
            return ("accepted" if label in FREE_FORM else "wrong"), fp.replace("\n", " | ")
        if status != 0:
            one = len(lines) == 1 and base in lines[0]
            return ("error" if one else "unclear"), " | ".join(lines[-3:])[:300]
        said = " ".join(lines)
        if probe_name == "resume" and re.search(r"falling back|using the newest checkpoint|trying an earlier", said):
            m = re.search(r"resumed from \S*/(step_\d+)", out)
            if not m:
                return "unclear", "announced a fallback but printed no 'resumed from'"
            step = m.group(1)
            if step not in self.resume_refs:  # the run resumed from that checkpoint on purpose
                self.fresh_live(scope)
                s2, _, e2, fp2 = self.execute("resume:" + step)
                self.resume_refs[step] = fp2 if s2 == 0 else f"failed: {e2[-200:]}"
            ok = fp == self.resume_refs[step]
            return ("fallback" if ok else "wrong"), f"to {step}: {lines[0][:200]}"
        if fp == self.refs[probe_name]:
            return "unchanged", ""
        return ("accepted" if label in FREE_FORM else "wrong"), f"result differs: {fp[:120]!r}"

    def damage(self, path, kind, offset, rng):
        with open(path, "rb") as f:
            data = bytearray(f.read())
        if kind == "truncate":
            data = data[:offset]
            how = f"truncated to {offset} of {os.path.getsize(path)} bytes"
        else:
            x = rng.randrange(1, 256)
            how = f"byte {offset} of {len(data)}: {data[offset]:#04x} ^ {x:#04x}"
            data[offset] ^= x
        with open(path, "wb") as f:
            f.write(data)
        return how

    def sweep_file(self, label, rel, probe_name, scope, rng):
        self.reference(probe_name, scope)
        size = os.path.getsize(os.path.join(self.world, rel))
        cases = [("truncate", o) for o in sorted(rng.sample(range(size), min(size, self.a.truncations)))]
        cases += [("flip", o) for o in sorted(rng.sample(range(size), min(size, self.a.flips)))]
        for kind, offset in cases:
            self.fresh_live(scope)
            how = self.damage(os.path.join(self.live, rel), kind, offset, rng)
            t0 = time.time()
            status, out, err, fp = self.execute(probe_name)
            outcome, detail = self.classify(label, rel, probe_name, scope, status, out, err, fp)
            self.rows.append((label, kind, outcome))
            mark = "ok  " if outcome in PASSING or (outcome == "accepted" and label in FREE_FORM) else "FAIL"
            print(f"{mark} {label:28} {how:44} {outcome:9} {time.time() - t0:5.1f} s  {detail}", flush=True)
        self.fresh_live(scope)

    def binary_inputs(self, rng):
        """prepare_data must refuse binary input with a clear message."""
        junk = os.path.join(self.root, "random.bin")
        with open(junk, "wb") as f:
            f.write(bytes(rng.randrange(256) for _ in range(4096)))
        w = self.world
        for path in (junk, f"{w}/ds/d.bin", f"{w}/ds/d.idx", f"{w}/ds/d.model", f"{w}/w/bpe.safetensors",
                     self.tool("sample")):
            out_dir = os.path.join(self.root, "out")
            shutil.rmtree(out_dir, ignore_errors=True)
            status, _, err = run([self.tool("prepare_data"), "--input", path, "--output-prefix", f"{out_dir}/p",
                                  "--vocab-size", "400", "--threads", "1"], self.a.timeout, self.env)
            lines = [l for l in err.splitlines() if l.strip()]
            ok = status not in (None, 0) and status > 0 and len(lines) == 1 and "not text" in lines[0] \
                and os.path.basename(path) in lines[0]
            outcome = "error" if ok else ("hang" if status is None else "crash" if status < 0 else
                                          "wrong" if status == 0 else "unclear")
            self.rows.append(("binary input to prepare_data", "whole file", outcome))
            print(f"{'ok  ' if ok else 'FAIL'} {'binary input to prepare_data':28} {os.path.basename(path):44} "
                  f"{outcome:9}        {' | '.join(lines)[:200]}", flush=True)

    def table(self):
        outcomes = ["error", "fallback", "unchanged", "accepted", "crash", "hang", "wrong", "unclear"]
        files = []
        for label, _, _ in self.rows:
            if label not in files:
                files.append(label)
        lines = ["| file | damage | " + " | ".join(outcomes) + " |", "| --- | --- |" + " ---: |" * len(outcomes)]
        for label in files:
            for kind in ("truncate", "flip", "whole file"):
                got = [o for l, k, o in self.rows if l == label and k == kind]
                if got:
                    lines.append(f"| {label} | {kind} ({len(got)}) | " +
                                 " | ".join(str(got.count(o) or "") for o in outcomes) + " |")
        return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", required=True, help="directory with prepare_data, train_gpt, sample, doctor")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock; printed)")
    p.add_argument("--truncations", type=int, default=10, help="random truncations per file")
    p.add_argument("--flips", type=int, default=10, help="random one-byte flips per file")
    p.add_argument("--only", default="", help="comma-separated file labels (default: all)")
    p.add_argument("--timeout", type=float, default=60, help="seconds before a run counts as a hang")
    p.add_argument("--setup-timeout", type=float, default=300, help="seconds for each setup run")
    p.add_argument("--corpus", default=os.path.join(os.environ.get("LOOM_DATA_DIR", "../shared/data"), "tinyshakespeare.txt"))
    p.add_argument("--corpus-bytes", type=int, default=30000, help="bytes of the corpus to use")
    p.add_argument("--keep", default="", help="work in this directory and keep it (default: a temporary one, removed)")
    args = p.parse_args()
    seed = args.seed if args.seed is not None else int(time.time() * 1000) % 1_000_000
    print(f"corrupt_sweep: seed {seed} (repeat with --seed {seed}); {args.truncations} truncations and "
          f"{args.flips} flips per file", flush=True)
    rng = random.Random(seed)
    s = Sweep(args)
    t0 = time.time()
    try:
        s.make_world()
        print(f"corrupt_sweep: valid files made in {time.time() - t0:.1f} s under {s.world}", flush=True)
        only = {x.strip() for x in args.only.split(",") if x.strip()}
        for label, rel, probe_name, scope in s.files():
            if not only or label in only:
                s.sweep_file(label, rel, probe_name, scope, rng)
        if not only or "binary" in only:
            s.binary_inputs(rng)
    finally:
        if not args.keep:
            shutil.rmtree(s.root, ignore_errors=True)
    print()
    print(s.table())
    bad = [r for r in s.rows if not (r[2] in PASSING or (r[2] == "accepted" and r[0] in FREE_FORM))]
    print(f"\ncorrupt_sweep: {len(s.rows)} runs in {time.time() - t0:.0f} s, {len(bad)} failed (seed {seed})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
