#!/usr/bin/env python3
"""Checks that an fp16 run stopped and resumed equals the uninterrupted run bit for bit: the
losses and loss scales of every step (metrics.jsonl; the scale is logged in a line of its own)
and the dynamic loss scaler's state in the step-6 checkpoints' manifests (enabled, and a
growth_tracker of 6: the resumed run took 3 steps, so 6 proves the good-step counter came back
from the checkpoint). Used by resume.sh (one rank) and layout.sh (tp2pp2).

  check_fp16_resume.py LABEL WHOLE_METRICS PART1_METRICS PART2_METRICS WHOLE_CKPT PART_CKPT

WHOLE_CKPT, PART_CKPT: the --checkpoint-dir of each run. Exit 0 when everything matches."""
import json
import sys


def steps(path):  # step -> [loss, loss scale]
    out = {}
    for line in open(path):
        r = json.loads(line)
        for i, key in enumerate(("train/loss", "train/loss_scale")):
            if key in r:
                out.setdefault(r["step"], [None, None])[i] = r[key]
    return out


label, whole, part1, part2, ckpt_whole, ckpt_part = sys.argv[1:7]
a = steps(whole)
b = {**steps(part1), **steps(part2)}
sa = json.load(open(ckpt_whole + "/step_00000006/manifest.json"))["loss_scaler"]
sb = json.load(open(ckpt_part + "/step_00000006/manifest.json"))["loss_scaler"]
good = sorted(a) == list(range(6)) and sorted(b) == sorted(a) and sa == sb and sa["enabled"] and sa["growth_tracker"] == 6
good = good and all(None not in a[s] and a[s] == b[s] for s in a)
print(label + ":", "bit for bit" if good else "DIFFERS", {s: a[s] for s in sorted(a)}, sa)
if not good:
    print("resumed", b, sb)
sys.exit(0 if good else 1)
