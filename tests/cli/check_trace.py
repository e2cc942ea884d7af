#!/usr/bin/env python3
"""Checks a train_gpt --profile-steps trace.json (Chrome trace-event JSON) of a multi-rank run.

  check_trace.py TRACE RANKS STEPS [--comm NAME:GROUP:BYTES ...] [--p2p BYTES]

- valid JSON object with traceEvents; one pid per rank 0..RANKS-1, each with a process_name
  "rank <pid>..." and exactly STEPS "step N" zones (the window);
- complete events nest per (pid, tid) track;
- every pid has kernel zones (matmul_forward, matmul_backward, adamw...) inside its step zones;
- --comm NAME:GROUP:BYTES: every pid has at least one comm zone NAME with args group == GROUP
  and bytes == BYTES (BYTES '*' = any positive), inside a step;
- --p2p BYTES: every send and recv is on group "pp" with a peer, every pid has a send or recv of
  BYTES bytes (a pipeline activation or its gradient), and sends == recvs over the whole trace.
Prints one summary line; exits non-zero with a message on the first failure.
"""
import collections
import json
import sys


def fail(msg):
    print("check_trace: " + msg)
    sys.exit(1)


def main(argv):
    if len(argv) < 4:
        fail(__doc__)
    path, ranks, steps = argv[1], int(argv[2]), int(argv[3])
    comm_specs, p2p = [], None
    rest = argv[4:]
    while rest:
        flag = rest.pop(0)
        if flag == "--comm":
            name, group, nbytes = rest.pop(0).split(":")
            comm_specs.append((name, group, None if nbytes == "*" else float(nbytes)))
        elif flag == "--p2p":
            p2p = float(rest.pop(0))
        else:
            fail("unknown flag " + flag)
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        fail(path + " is not a trace-event JSON object")
    events = doc["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    zones = [e for e in events if e.get("ph") == "X"]
    pids = sorted({e["pid"] for e in zones})
    if pids != list(range(ranks)):
        fail(f"pids {pids}, expected 0..{ranks - 1}")
    for p in pids:
        if not names.get(p, "").startswith(f"rank {p}"):
            fail(f"pid {p} is named {names.get(p)!r}")

    tracks = collections.defaultdict(list)
    for e in zones:
        tracks[(e["pid"], e["tid"])].append(e)
    for key, zs in tracks.items():
        zs.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_ends = []
        for e in zs:
            while open_ends and e["ts"] >= open_ends[-1]:
                open_ends.pop()
            if open_ends and e["ts"] + e["dur"] > open_ends[-1] + 1e-3:
                fail(f"track {key}: {e['name']} at {e['ts']} overlaps the end of its enclosing zone")
            open_ends.append(e["ts"] + e["dur"])

    def inside_step(e, step_zones):
        return any(s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] + 1e-3 for s in step_zones)

    sends = recvs = 0
    send_pids, recv_pids = set(), set()
    for p in pids:
        mine = [e for e in zones if e["pid"] == p]
        step_zones = [e for e in mine if e.get("cat") == "step" and e["name"].startswith("step ")]
        if len(step_zones) != steps:
            fail(f"pid {p}: {len(step_zones)} step zones, expected {steps} (the window)")
        kernels = [e for e in mine if e.get("cat") == "kernel"]
        kinds = {e["name"] for e in kernels}
        for k in ("matmul_forward", "matmul_backward", "layernorm_forward", "attention_forward", "attention_backward"):
            if k not in kinds:
                fail(f"pid {p}: no {k} kernel zone (kernels: {sorted(kinds)})")
        if not any(k.startswith("adamw") for k in kinds):
            fail(f"pid {p}: no adamw kernel zone")
        outside = [e["name"] for e in kernels if not inside_step(e, step_zones)]
        if outside:
            fail(f"pid {p}: kernel zones outside the steps: {outside[:5]}")
        comm = [e for e in mine if e.get("cat") == "comm"]
        for name, group, nbytes in comm_specs:
            hits = [e for e in comm if e["name"] == name and e.get("args", {}).get("group") == group
                    and (e["args"].get("bytes", 0) > 0 if nbytes is None else e["args"].get("bytes") == nbytes)
                    and inside_step(e, step_zones)]
            if not hits:
                seen = sorted({(e["name"], e.get("args", {}).get("group"), e.get("args", {}).get("bytes")) for e in comm})
                fail(f"pid {p}: no {name} zone on group {group} with bytes {nbytes}; comm zones: {seen[:12]}")
        if p2p is not None:
            p2p_sizes = set()
            for e in comm:
                if e["name"] not in ("send", "recv"):
                    continue
                a = e.get("args", {})
                p2p_sizes.add(a.get("bytes"))
                if a.get("group") != "pp" or a.get("peer", -1) < 0:
                    fail(f"pid {p}: {e['name']} with args {a}, expected group pp and a peer")
                if e["name"] == "send":
                    sends += 1
                    send_pids.add(p)
                else:
                    recvs += 1
                    recv_pids.add(p)
            if p2p not in p2p_sizes:
                fail(f"pid {p}: no send/recv of {p2p:.0f} bytes (sizes seen: {sorted(p2p_sizes)})")
    if p2p is not None and (not send_pids or not recv_pids or sends != recvs):
        fail(f"send/recv: {sends} sends on pids {sorted(send_pids)}, {recvs} recvs on pids {sorted(recv_pids)}")
    per_rank = doc.get("otherData", {}).get("recorder_seconds_per_rank", [])
    print(f"trace ok: {len(pids)} ranks, {len(zones)} zones, {steps} steps each, {sends} send / {recvs} recv, "
          f"recorder overhead per rank (s) {per_rank}")


if __name__ == "__main__":
    main(sys.argv)
