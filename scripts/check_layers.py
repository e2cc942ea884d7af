#!/usr/bin/env python3
"""Checks that no folder of include/loom includes a folder above it.

The folders, lowest first (docs/README.md, "Layers"): a header may include headers of its own
folder and of folders listed before it, never after. The umbrella headers directly in
include/loom/ (loom/io.hpp, ...) may include anything.

    scripts/check_layers.py [include dir]     # exit 1 and one line per violation
"""
import pathlib
import re
import sys

LAYERS = [
    "bench",      # peak probes (no loom includes)
    "core",       # errors, buffers, views, contexts, the device concept, layout<TP,PP>
    "device",     # cpu, ascend (ACL runtime), allocators
    "precision",  # fp32/bf16/fp16 policies, the loss scaler
    "data",       # text pipeline, datasets, loaders
    "kernels",    # the ops contract and its CPU/Ascend implementations
    "models",     # model configs, recipes, the parameter table, fits (the architecture as data)
    "parallel",   # communicators, tensor-parallel mappings, the 1F1B schedule and executor, data parallelism
    "nn",         # the one model, activations, sharding, generation
    "optim",      # AdamW, ZeRO-1, schedules
    "verify",     # comparison against reference models
    "io",         # checkpoints, weights, logs, traces
    "train",      # the trainer, sessions, metrics, console, planning
]
RANK = {name: i for i, name in enumerate(LAYERS)}
INCLUDE = re.compile(r'^\s*#\s*include\s*<loom/([a-z_0-9]+)/')


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "include") / "loom"
    bad = []
    for header in sorted(root.rglob("*.hpp")):
        rel = header.relative_to(root)
        if len(rel.parts) < 2:
            continue  # umbrella header
        folder = rel.parts[0]
        if folder not in RANK:
            bad.append(f"include/loom/{rel}: folder '{folder}' has no place in scripts/check_layers.py LAYERS; add it")
            continue
        for n, line in enumerate(header.read_text().splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1)
            if target not in RANK:
                bad.append(f"include/loom/{rel}:{n}: includes loom/{target}/, a folder not in LAYERS")
            elif RANK[target] > RANK[folder]:
                bad.append(f"include/loom/{rel}:{n}: '{folder}' includes loom/{target}/, a layer above it "
                           f"(order: {' < '.join(LAYERS)}); move the shared piece down or the header up")
    for b in bad:
        print(b)
    if not bad:
        print(f"layers: {' < '.join(LAYERS)}: no header includes a layer above its own")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
