#!/usr/bin/env python3
"""Kill storm: SIGKILL a multi-rank train_gpt run at random moments, resume it each time, and
check what a crash may never do (docs/reliability.md, "Kill storm").

A *storm* is one training run of char_tiny that saves a checkpoint after every step (train_gpt's
background saves) and is driven to its last step through kills: each attempt is started (fresh
with --checkpoint-dir while the directory holds no step_* directory, else with --resume), killed
with SIGKILL after a random delay, and started again, until an attempt reaches the end unkilled.
Under threads (--ranks N, --layout) the ranks share one process, so a kill ends every rank; under
MPI (mpiexec -n 4 ... --comm mpi) a kill hits one random rank's process or every rank's process,
and its delay counts from rank 0's first output line (--kill-during-mpi-init: from the launch).

Checked, each a failure when it does not hold:
  * every attempt ends: a killed MPI rank makes the others exit, within --hang-timeout seconds;
    an attempt that was not killed exits with status 0 within --attempt-timeout seconds;
  * every resume loaded a complete checkpoint: the "resumed from DIR: step N" line names a
    checkpoint that existed when the attempt started, whose tensor files equal those of the
    uninterrupted reference run's step N byte for byte, and whose manifest equals the
    reference's but for created_utc and its checksum (so nothing partial or stale was loaded);
    it is the checkpoint `latest` named, unless train_gpt warned that it fell back;
  * at the end of each storm, the final weights (--out) and the final checkpoint's tensor files
    equal the reference run's byte for byte, the checkpoint directory holds only step_* and
    `latest`, and the output directory only the --out file;
  * no file outside the checkpoint and output directories was created, changed or removed: the
    data (all files of its prefix), the original corpus, train_gpt itself and the working
    directory are hashed before and after (size, mtime and SHA-256).

Reported per mode: kills (one rank / all ranks), kills that found a save in flight (a .tmp-*
directory), attempts, resumes, resumes that used an older checkpoint than the newest step_*
directory (a committed save whose `latest` had not moved yet: by design), fallbacks (train_gpt
warned that a checkpoint was unusable), storms and failures; wall and CPU seconds.

  kill_storm.py BIN_DIR [--threads-kills N] [--mpi-kills N] [--seed S] [...] [-- MPIEXEC...]

MPIEXEC is the launcher with its flags (e.g. `mpirun --allow-run-as-root --oversubscribe`);
without it the MPI part is skipped with a message. Exit status 0 when every check held.
Standard library only."""
import argparse
import hashlib
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The runs a storm cycles through, per mode: (name, flags). Threads: rank 0 saves alone (plain
# data parallel), or every rank takes part in a collective save (ZeRO-1, a layout). MPI: 4
# processes, collective saves (ZeRO-1 over dp 4; tp 2 x dp 2 with ZeRO-1; tp 2 x pp 2).
CONFIGS = {
    "threads": [
        ("dp2", ["--ranks", "2"]),
        ("tp2pp1-dp2-zero1", ["--layout", "tp2pp1", "--ranks", "4", "--zero1"]),
        ("dp2-zero1", ["--ranks", "2", "--zero1"]),
        ("tp2pp2", ["--layout", "tp2pp2", "--ranks", "4", "--grad-accum", "2"]),
    ],
    "mpi": [
        ("dp4-zero1", ["--comm", "mpi", "--zero1"]),
        ("tp2pp1-dp2-zero1", ["--comm", "mpi", "--layout", "tp2pp1", "--zero1"]),
        ("tp2pp2", ["--comm", "mpi", "--layout", "tp2pp2", "--grad-accum", "2"]),
    ],
}
MPI_RANKS = 4
RESUMED = re.compile(r"resumed from (\S+): step (\d+), (\d+) tokens seen")


def sha256(path):
    """SHA-256 of a file's bytes, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree(root):
    """{relative path: SHA-256} of every file under `root` (empty when it does not exist).
    A file that vanishes while we read (a save in flight) is left out."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            try:
                out[str(p.relative_to(root))] = sha256(p)
            except OSError:
                pass
    return out


def fingerprint(paths):
    """{path: (size, mtime_ns, SHA-256)} of the given files and of every file under the given
    directories: what must not change outside the checkpoint and output directories."""
    out = {}
    for p in map(Path, paths):
        files = [p] if p.is_file() else [q for q in p.rglob("*") if q.is_file()] if p.is_dir() else []
        if p.is_dir():
            out[str(p) + "/"] = ("dir", sorted(str(q.relative_to(p)) for q in p.rglob("*")))
        for q in files:
            st = q.stat()
            out[str(q)] = (st.st_size, st.st_mtime_ns, sha256(q))
    return out


def snapshot_checkpoints(ckpt):
    """What `ckpt` holds now: {"latest": its text or None, "dirs": {step_NNNNNNNN: {"files":
    {name: SHA-256}, "manifest": text or None}}}. Read before an attempt starts, so that the
    checkpoint a resume names can be checked as it was when it was loaded."""
    snap = {"latest": None, "dirs": {}}
    if not ckpt.is_dir():
        return snap
    latest = ckpt / "latest"
    if latest.is_file():
        snap["latest"] = latest.read_text().strip()
    for d in sorted(ckpt.glob("step_*")):
        files = tree(d)
        manifest = d / "manifest.json"
        snap["dirs"][d.name] = {"files": files, "manifest": manifest.read_text() if manifest.is_file() else None}
    return snap


def manifest_core(text):
    """A manifest's JSON without the fields that differ between two saves of the same state."""
    m = json.loads(text)
    m.pop("created_utc", None)
    m.pop("checksum", None)
    return m


def checkpoint_mismatch(got, ref_dir):
    """Why checkpoint `got` ({"files": {name: SHA-256}, "manifest": text}) is not the reference
    run's `ref_dir`, or None when every tensor file is byte-identical and the manifests agree
    but for created_utc and the checksum."""
    if not Path(ref_dir).is_dir():
        return f"the reference run has no {Path(ref_dir).name}"
    ref = {p.name: sha256(p) for p in Path(ref_dir).iterdir()}
    if set(got["files"]) != set(ref):
        return f"files {sorted(got['files'])} != the reference's {sorted(ref)}"
    for name, h in sorted(got["files"].items()):
        if name != "manifest.json" and h != ref[name]:
            return f"{name} differs from the reference's"
    try:
        same = manifest_core(got["manifest"]) == manifest_core((Path(ref_dir) / "manifest.json").read_text())
    except (TypeError, ValueError) as e:
        return f"manifest.json does not parse: {e}"
    return None if same else "manifest.json differs from the reference's (beyond created_utc and checksum)"


def children(pid):
    """Pids of the live (not zombie) processes whose parent is `pid`."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(d.name))
    return out


def alive(pid):
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


def mpi_rank_of(pid):
    """OMPI_COMM_WORLD_RANK of process `pid`, or None (not an MPI rank, or gone)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for e in env:
        if e.startswith(b"OMPI_COMM_WORLD_RANK="):
            return int(e.split(b"=", 1)[1])
    return None


def rank_processes(proc, mpi, wait_s):
    """{rank: pid} of a running attempt: the process itself under threads; under MPI the
    launcher's children that carry an MPI rank (waiting up to `wait_s` for all of them)."""
    if not mpi:
        return {0: proc.pid}
    deadline = time.monotonic() + wait_s
    ranks = {}
    while time.monotonic() < deadline and proc.poll() is None:
        ranks = {}
        for pid in children(proc.pid):
            r = mpi_rank_of(pid)
            if r is not None:
                ranks[r] = pid
        if len(ranks) == MPI_RANKS:
            break
        time.sleep(0.01)
    return ranks


class Storm:
    """Settings shared by every attempt of one mode: the train_gpt command line and the
    directories. `launcher` is [] for threads, the mpiexec command for MPI."""

    def __init__(self, args, mode, name, flags, launcher, work):
        self.args, self.mode, self.name = args, mode, name
        self.mpi = mode == "mpi"
        self.launcher = launcher + (["-n", str(MPI_RANKS)] if self.mpi else [])
        self.base = [str(Path(args.bin) / "train_gpt"), "--data", str(args.data_copy), "--model", "char_tiny",
                     "--steps", str(args.steps), "--micro-batch", "4", "--eval-every", "0", "--sample-tokens", "0",
                     "--peak-gflops", "1", "--summary-every", "0", "--log-dir", "", "--save-every", "1"] + flags
        self.work = work / f"{mode}-{name}"
        self.cwd = work / "cwd"  # train_gpt's working directory: must stay empty

    def run(self, ckpt, extra, out_dir, tag, kill_at=None, kill_kind=None, rng=None):
        """One attempt: runs train_gpt with `extra` flags (checkpoints in `ckpt`), writing --out
        into `out_dir`; kills it after `kill_at` seconds (kill_kind "one" or "all" ranks) unless
        it ended first. Returns a dict: status, killed, hang (a string when it did not end in
        time), stdout, stderr, seconds, tmp_at_kill (a save was in flight when killed)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        log, err = self.work / f"{tag}.out", self.work / f"{tag}.err"
        cmd = self.launcher + self.base + extra + ["--out", str(out_dir / "w.safetensors")]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        t0 = time.monotonic()
        with open(log, "wb") as o, open(err, "wb") as e:
            proc = subprocess.Popen(cmd, stdout=o, stderr=e, stdin=subprocess.DEVNULL, cwd=self.cwd, env=env,
                                    start_new_session=True)
        res = {"killed": False, "hang": None, "tmp_at_kill": False, "kind": kill_kind, "t0": t0, "victims": []}
        try:
            if kill_at is not None:
                if self.mpi and not self.args.kill_during_mpi_init:
                    started = self._wait_for_banner(proc, log)
                    kill_at = max(0.0, kill_at - started)
                try:
                    proc.wait(timeout=kill_at)
                except subprocess.TimeoutExpired:
                    self._kill(proc, ckpt, kill_kind, rng, res)
            if not res["hang"]:
                limit = self.args.hang_timeout if res["killed"] else self.args.attempt_timeout
                try:
                    proc.wait(timeout=limit)
                except subprocess.TimeoutExpired:
                    res["hang"] = (f"still running {limit:.0f} s after the kill" if res["killed"]
                                   else f"did not finish within {limit:.0f} s")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        res.update(status=proc.returncode, seconds=time.monotonic() - t0,
                   stdout=log.read_text(errors="replace"), stderr=err.read_text(errors="replace"))
        return res

    def _wait_for_banner(self, proc, log):
        """Waits until rank 0 printed its first line (every rank is past MPI_Init then) or the
        attempt ended; returns the seconds waited. Open MPI 4.1 can leave the other ranks
        waiting in MPI_Init when one is killed while mpirun is still launching them."""
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < self.args.attempt_timeout:
            if log.stat().st_size > 0:
                break
            time.sleep(0.005)
        return time.monotonic() - t0

    def _kill(self, proc, ckpt, kind, rng, res):
        """SIGKILLs one random rank's process or every rank's; records whether a save was in
        flight and, under MPI, whether the other ranks ended (else res["hang"])."""
        ranks = rank_processes(proc, self.mpi, 5.0)
        if not ranks:
            return  # ended (or never started its ranks) before the kill
        res["tmp_at_kill"] = ckpt.is_dir() and any(p.name.startswith(".tmp-") for p in ckpt.iterdir())
        victims = [ranks[rng.choice(sorted(ranks))]] if kind == "one" else list(ranks.values())
        res["victims"] = sorted(r for r, p in ranks.items() if p in victims)
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        res["killed"] = True
        deadline = time.monotonic() + self.args.hang_timeout
        while time.monotonic() < deadline and any(alive(p) for p in ranks.values()):
            time.sleep(0.02)
        left = [r for r, p in ranks.items() if alive(p)]
        if left:
            res["hang"] = (f"ranks {left} still running {self.args.hang_timeout:.0f} s after the kill of rank(s) "
                           f"{res['victims']} at {time.monotonic() - res['t0'] - self.args.hang_timeout:.2f} s")
            if os.environ.get("KILL_STORM_GDB"):  # a developer's aid: where the survivors wait
                for r in left:
                    subprocess.run(["gdb", "-p", str(ranks[r]), "-batch", "-ex", "thread apply all bt 12"],
                                   stdout=open(self.work / f"hang-rank{r}-{ranks[r]}.txt", "w"),
                                   stderr=subprocess.STDOUT)


class Tally:
    """The counts of one mode, and its failures (one line each)."""

    def __init__(self, mode):
        self.mode = mode
        self.kills = {"one": 0, "all": 0}
        self.kills_in_save = 0      # a .tmp-* directory (a save in flight) was there at the kill
        self.attempts = self.resumes = self.resumes_lagging = self.fallbacks = 0
        self.killed_before_loading = 0  # resumed attempts killed before their "resumed from" line
        self.storms = self.storms_exact = 0
        self.unpruned = 0  # storms that ended with more than --keep checkpoints (see check_end)
        self.weights_kept = 0  # final weights written by a killed attempt, kept by the next one (check_end)
        self.failures = []

    def fail(self, what):
        self.failures.append(f"{self.mode}: {what}")
        print(f"FAILED: {self.mode}: {what}", flush=True)

    def line(self):
        k = self.kills["one"] + self.kills["all"]
        return (f"{self.mode}: {k} kills ({self.kills['one']} of one rank, {self.kills['all']} of all ranks; "
                f"{self.kills_in_save} with a save in flight), {self.attempts} attempts, {self.resumes} resumes "
                f"({self.resumes_lagging} from an older checkpoint than the newest step_* directory, because "
                f"`latest` had not moved yet; {self.fallbacks} fallbacks past an unusable checkpoint; "
                f"{self.killed_before_loading} attempts killed before they loaded), {self.storms_exact} of "
                f"{self.storms} storms bit-exact ({self.unpruned} ended with unpruned older checkpoints, "
                f"{self.weights_kept} with the final weights kept by a later attempt), "
                f"{len(self.failures)} failures")


def check_resume(ckpt, res, before, ref_ckpt, tally):
    """Checks the checkpoint a resumed attempt loaded, against the snapshot `before` taken when
    it started and the reference run's checkpoints; counts the resume."""
    m = RESUMED.search(res["stdout"])
    fallback = "falling back" in res["stderr"] or "is unusable" in res["stderr"]
    tally.fallbacks += fallback
    if fallback:  # SIGKILL loses no written byte: every committed checkpoint must verify
        tally.fail(f"a resume fell back past an unusable checkpoint: {res['stderr'].strip()[-400:]}")
    if not m:
        if res["killed"]:
            tally.killed_before_loading += 1
        return
    tally.resumes += 1
    where, step = Path(m[1]), int(m[2])
    name = where.name
    if where.parent != ckpt or name != f"step_{step:08d}":
        return tally.fail(f"resumed from {where} (step {step}), not a step directory of {ckpt}")
    got = before["dirs"].get(name)
    if got is None:
        return tally.fail(f"resumed from {name}, which did not exist when the attempt started")
    why = checkpoint_mismatch(got, ref_ckpt / name)
    if why:
        tally.fail(f"resumed from {name}, which is not the reference's checkpoint of step {step}: {why}")
    if before["latest"] in before["dirs"] and name != before["latest"] and not fallback:
        tally.fail(f"resumed from {name} while `latest` named {before['latest']}, with no warning")
    newest = max(int(d[5:]) for d in before["dirs"])
    tally.resumes_lagging += step < newest


def check_end(st, ref, storm_dir, last, tally):
    """After the attempt `last` (run()'s result) reached the last step: the final weights and
    checkpoint equal the reference's byte for byte, and the checkpoint and output directories
    hold nothing else. More than --keep checkpoints are allowed only when the previous attempt
    was killed between moving `latest` to the last step and pruning, so that `last` resumed at
    the last step and had nothing to save (no save, no pruning; docs/checkpoint.md, crash during
    step 7); they are counted. Returns True when all of it holds."""
    ckpt, out, failed = storm_dir / "ckpt", storm_dir / "out", len(tally.failures)
    final = f"step_{st.args.steps:08d}"
    if not (out / "w.safetensors").is_file():
        tally.fail("the run that reached the end wrote no weights (--out)")
    elif sha256(out / "w.safetensors") != sha256(ref / "out" / "w.safetensors"):
        tally.fail("the final weights (--out) differ from the uninterrupted run's")
    snap = snapshot_checkpoints(ckpt)
    if snap["latest"] != final or final not in snap["dirs"]:
        tally.fail(f"at the end `latest` names {snap['latest']}, not {final}")
    elif why := checkpoint_mismatch(snap["dirs"][final], ref / "ckpt" / final):
        tally.fail(f"the final checkpoint is not the uninterrupted run's: {why}")
    listing = sorted(p.name for p in ckpt.iterdir()) if ckpt.is_dir() else []
    stray = [n for n in listing if n != "latest" and not re.fullmatch(r"step_\d{8}", n)]
    if stray:
        tally.fail(f"left in the checkpoint directory: {stray}")
    if len(snap["dirs"]) > st.args.keep:
        m = RESUMED.search(last["stdout"])
        if m and int(m[2]) == st.args.steps:
            tally.unpruned += 1
        else:
            tally.fail(f"{len(snap['dirs'])} checkpoints kept, more than --keep {st.args.keep}")
    extra = sorted(p.name for p in out.iterdir() if p.name != "w.safetensors") if out.is_dir() else []
    # an attempt killed after writing its weights (the last step done) leaves them to the next
    # attempt, which keeps them as w.previous-<k>.safetensors: the reference's weights too
    kept = [n for n in extra if re.fullmatch(r"w\.previous-\d+\.safetensors", n)]
    for n in kept:
        if sha256(out / n) != sha256(ref / "out" / "w.safetensors"):
            tally.fail(f"the kept weights {n} differ from the uninterrupted run's")
    tally.weights_kept += len(kept)
    extra = [n for n in extra if n not in kept]
    if extra:
        tally.fail(f"left in the output directory: {extra}")
    return len(tally.failures) == failed


def reference(st, tally):
    """The uninterrupted run (every checkpoint kept): what every storm of this run must equal.
    Returns its directory and wall seconds, or None when it failed."""
    ref = st.work / "reference"
    res = st.run(ref / "ckpt", ["--checkpoint-dir", str(ref / "ckpt"), "--keep", "0"], ref / "out", "reference")
    if res["status"] != 0 or res["hang"]:
        tally.fail(f"{st.name}: the uninterrupted run failed ({res['hang'] or 'status ' + str(res['status'])}): "
                   f"{res['stderr'].strip()[-400:]}")
        return None
    return ref, res["seconds"]


def storm(st, ref, ref_seconds, rng, kills, tally, index):
    """One storm: attempts of run `st` until one reaches the end unkilled; at most `kills` of
    them are killed, each after a random delay in [0, ref_seconds * --kill-window). Returns the
    kills made."""
    storm_dir = st.work / f"storm{index:03d}"
    ckpt, out = storm_dir / "ckpt", storm_dir / "out"
    made = 0
    for attempt in range(10 * kills + 10):
        before = snapshot_checkpoints(ckpt)
        resume = bool(before["dirs"])
        kill = made < kills
        kind = rng.choice(["one", "all"]) if st.mpi and kill else "all"
        kill_at = rng.uniform(0, ref_seconds * st.args.kill_window) if kill else None
        extra = ["--resume", str(ckpt)] if resume else ["--checkpoint-dir", str(ckpt)]
        res = st.run(ckpt, extra + ["--keep", str(st.args.keep)], out, f"storm{index:03d}-{attempt:03d}", kill_at,
                     kind, rng)
        tally.attempts += 1
        if res["killed"]:
            made += 1
            tally.kills[kind] += 1
            tally.kills_in_save += res["tmp_at_kill"]
        if resume:
            check_resume(ckpt, res, before, ref / "ckpt", tally)
        if res["hang"]:
            tally.fail(f"{st.name} attempt {attempt}: {res['hang']}; stderr: {res['stderr'].strip()[-300:]}")
            return made
        if not res["killed"]:
            if res["status"] != 0:
                tally.fail(f"{st.name} attempt {attempt} exited with status {res['status']} unkilled: "
                           f"{res['stderr'].strip()[-400:]}")
                return made
            tally.storms += 1
            exact = check_end(st, ref, storm_dir, res, tally)
            tally.storms_exact += exact
            if not exact:
                print(f"  kept for inspection: {storm_dir} (logs {st.work}/storm{index:03d}-*)", flush=True)
            elif not st.args.keep_work:
                shutil.rmtree(storm_dir, ignore_errors=True)
            return made
    tally.fail(f"{st.name}: no attempt reached the end")
    return made


def run_mode(args, mode, launcher, work, rng, kills):
    """Storms of `mode` ("threads" or "mpi") over its configurations in turn until `kills`
    kills were made; then checks that nothing outside the checkpoint and output directories
    changed. Returns the Tally."""
    tally = Tally(mode)
    configs = [(n, f) for n, f in CONFIGS[mode] if not args.configs or f"{mode}:{n}" in args.configs]
    if not configs:
        tally.fail(f"no configuration of {mode} among --configs {','.join(args.configs)}")
        return tally
    refs = {}
    made = index = 0
    while made < kills:  # storms are independent (a fresh directory each): go on past a failure
        if index >= 4 * kills + 20:
            tally.fail(f"{index} storms made only {made} of {kills} kills; raise --kill-window")
            break
        name, flags = configs[index % len(configs)]
        st = Storm(args, mode, name, flags, launcher, work)
        if name not in refs:
            refs[name] = reference(st, tally)
            if refs[name]:
                print(f"{mode} {name}: uninterrupted run {refs[name][1]:.1f} s", flush=True)
        if not refs[name]:
            break
        ref, seconds = refs[name]
        got = storm(st, ref, seconds, rng, min(args.kills_per_storm, kills - made), tally, index)
        made += got
        index += 1
        print(f"{mode} {name} storm {index}: {got} kills, {made}/{kills} so far", flush=True)
    return tally


def parse(argv):
    """Command line: kill_storm.py BIN_DIR [options] [-- MPIEXEC...]."""
    launcher = []
    if "--" in argv:
        i = argv.index("--")
        argv, launcher = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bin", help="directory holding train_gpt")
    p.add_argument("--kills", type=int, help="kills per mode (sets --threads-kills and --mpi-kills)")
    p.add_argument("--threads-kills", type=int, default=8, help="kills of --comm threads runs (default 8)")
    p.add_argument("--mpi-kills", type=int, default=4, help="kills of mpiexec -n 4 runs (default 4)")
    p.add_argument("--seed", type=int, help="seed of the kill delays and victims (default: from the clock)")
    p.add_argument("--steps", type=int, default=12, help="training steps of a run (default 12)")
    p.add_argument("--keep", type=int, default=2, help="train_gpt --keep of the storm runs (default 2)")
    p.add_argument("--kills-per-storm", type=int, default=4, help="kills before a storm runs to its end (default 4)")
    p.add_argument("--kill-window", type=float, default=1.0,
                   help="kill after U[0, W x the uninterrupted run's seconds) (default 1.0)")
    p.add_argument("--configs", default="", help="comma list of mode:name to use (default all): " +
                   ", ".join(f"{m}:{n}" for m in CONFIGS for n, _ in CONFIGS[m]))
    p.add_argument("--kill-during-mpi-init", action="store_true",
                   help="MPI: draw kill moments from the launch on, not from rank 0's first line (Open MPI "
                        "4.1 may then leave the other ranks waiting in MPI_Init: counted as hangs)")
    p.add_argument("--hang-timeout", type=float, default=30, help="seconds the ranks get to end after a kill")
    p.add_argument("--attempt-timeout", type=float, default=300, help="seconds an unkilled attempt may take")
    p.add_argument("--data", default=os.path.join(os.environ.get("LOOM_DATA_DIR", "../shared/data"),
                                                  "tinyshakespeare.txt"), help="corpus (its first 60000 bytes are used)")
    p.add_argument("--work", help="work directory (default: a new temporary one, removed unless --keep-work)")
    p.add_argument("--keep-work", action="store_true", help="keep the storms' directories and logs")
    args = p.parse_args(argv)
    if args.kills is not None:
        args.threads_kills = args.mpi_kills = args.kills
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little")
    args.configs = [c for c in args.configs.split(",") if c]
    args.bin = str(Path(args.bin).resolve())  # train_gpt runs in a directory of its own
    return args, launcher


def main(argv):
    args, launcher = parse(argv)
    print(f"kill storm: seed {args.seed} (rerun with --seed {args.seed}; the kill moments repeat, the "
          f"machine's timing does not)", flush=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="kill_storm.")).resolve()
    (work / "cwd").mkdir(parents=True, exist_ok=True)
    data_dir = work / "input"
    data_dir.mkdir(exist_ok=True)
    args.data_copy = data_dir / "corpus.txt"
    args.data_copy.write_bytes(Path(args.data).read_bytes()[:60000])
    # everything that must not change: the data (every file of its prefix), the corpus it came
    # from, the program, and train_gpt's (empty) working directory
    watched = [data_dir, args.data, Path(args.bin) / "train_gpt", work / "cwd"]
    before = fingerprint(watched)
    rng = random.Random(args.seed)
    cpu0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    tallies = []
    for mode, kills in (("threads", args.threads_kills), ("mpi", args.mpi_kills)):
        if kills <= 0:
            continue
        if mode == "mpi" and not launcher:
            print("mpi: skipped (no launcher after --; pass e.g. -- mpirun --allow-run-as-root --oversubscribe)")
            continue
        tallies.append(run_mode(args, mode, launcher if mode == "mpi" else [], work, rng, kills))
    after = fingerprint(watched)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    failures = [f for t in tallies for f in t.failures]
    if changed:
        failures.append(f"files outside the checkpoint and output directories changed: {changed}")
        print(f"FAILED: {failures[-1]}")
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
    print("---- kill storm ----")
    for t in tallies:
        print(t.line())
    print(f"outside the checkpoint directories: {len(before)} files and directories watched, "
          f"{len(changed)} changed")
    print(f"seed {args.seed}, {time.monotonic() - t0:.0f} s wall, {cpu:.0f} CPU-seconds; "
          f"{'FAILED' if failures else 'passed'}")
    if not failures and not args.keep_work and not args.work:
        shutil.rmtree(work, ignore_errors=True)
    elif failures:
        print(f"logs kept in {work}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
