#!/usr/bin/env python3
"""What Dynamo's restart after a frame exchange costs a compile, and what
the package's skip of it (``enable(skip_restart=True)``, the default) gives
back: docs/python.md, "No second trace".

Usage (in the torch environment, after ``scripts/setup-python.sh``)::

    "$CCOL_TORCH_PYTHON" bench/torch_restart_cost.py [--ranks 2,4] [--repeats 5]
        [--layers 120] [--warm-runs 3] [--with-restart-mode] [--json]

For each world size of ``--ranks`` it starts that many rank processes (CPU
Gloo over a FileStore). Each rank compiles, ``--repeats`` times and in each
of three (or four) modes in turn (each repeat starting with the next mode),
a fresh function that runs a model of ``--layers`` linear layers (16×16,
each followed by a ReLU), with a backend that only counts (so a compile is
Dynamo's own work):

- ``off``: compiler collectives off;
- ``pytorch``: PyTorch's own exchange (under the PyTorch oracle's one CPU
  patch), which always restarts;
- ``package``: the package (``exchange="always"``: every compile exchanged,
  as PyTorch's), skipping the restart where it cannot change anything;
- ``package_restart`` (``--with-restart-mode``): the package with
  ``skip_restart=False``. (With it, the package's own figures came out
  0.2-0.4 s slower on the 2-core machine, with the same analyses: see
  docs/performance.md; the three modes alone are the comparison.)

Three cases, each a call timed after a barrier (wall: the slowest rank's;
CPU: the process CPU time of that call, the slowest rank's; attempts:
Dynamo's analysis attempts, ``InstructionTranslator.run`` calls, rank 0's):

- ``first``: the first call, the same shapes on every rank;
- ``differ``: the second call, on a batch of ``9 + rank`` rows after a first
  call on 8 on every rank: a recompile where the ranks' shapes differ (the
  restart changes the graph: every mode restarts);
- ``break``: the first call of a frame with a graph break halfway through
  the layers.

``--warm-runs N`` then runs ``crates/python/examples/train_lm.py`` under
``torchrun --nproc-per-node 2`` with the Inductor backend: once to fill a
fresh cache directory, then N times with the skip and N times without it,
alternating, on that warm cache; it reports each run's step 0 and the time
Dynamo spent compiling frames, the slowest rank's.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from torch_compiler_collective import emit_rows, join_job, run_ranks, use_exchange  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODES = ("off", "pytorch", "package")
#: With ``--with-restart-mode``: the package with ``skip_restart=False`` too.
RESTART_MODE = "package_restart"
CASES = ("first", "differ", "break")


def worker(rank: int, world: int, store: str, repeats: int, layers: int, modes) -> None:
    import gc
    import time

    import torch
    import torch.distributed as dist

    original, patched = join_job(rank, world, store)
    import compiler_collectives.torch as cct
    import torch._dynamo.symbolic_convert as sc

    torch.set_num_threads(1)
    attempts = [0]
    run = sc.InstructionTranslator.run

    def counted_run(self):
        attempts[0] += 1
        return run(self)

    sc.InstructionTranslator.run = counted_run
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(layers)
                                  for m in (torch.nn.Linear(16, 16), torch.nn.ReLU())])
    half = layers  # modules in the first half (a Linear and a ReLU per layer)
    raw = {c: {m: {"wall": [], "cpu": [], "attempts": []} for m in modes} for c in CASES}

    def timed(case, mode, call):
        attempts[0] = 0
        # The garbage of earlier compiles is collected here, not inside the
        # timed call of whichever mode comes next.
        gc.collect()
        dist.barrier()
        wall, cpu = time.perf_counter(), time.process_time()
        call()
        raw[case][mode]["wall"].append(time.perf_counter() - wall)
        raw[case][mode]["cpu"].append(time.process_time() - cpu)
        raw[case][mode]["attempts"].append(attempts[0])

    for k in range(repeats):
        # Each repeat starts with another mode: none always runs first or
        # last in a process whose memory grows with its compiles.
        for mode in modes[k % len(modes):] + modes[:k % len(modes)]:
            for case in CASES:
                use_exchange("package" if mode.startswith("package") else mode, original,
                             patched, skip_restart=mode == "package")
                if case == "break":
                    body = ("    for m in list(model)[:half]:\n        x = m(x)\n"
                            "    torch._dynamo.graph_break()\n"
                            "    for m in list(model)[half:]:\n        x = m(x)\n    return x\n")
                else:
                    body = "    return model(x)\n"
                scope = {"model": model, "torch": torch, "half": half}
                name = f"<restart-cost-{case}-{mode}-{k}>"
                exec(compile(f"def f(x):\n{body}", name, "exec"), scope)  # noqa: S102
                compiled = torch.compile(scope["f"], backend=lambda gm, _: gm.forward)
                if case == "differ":
                    compiled(torch.ones(8, 16))
                    timed(case, mode, lambda: compiled(torch.ones(9 + rank, 16)))
                else:
                    timed(case, mode, lambda: compiled(torch.ones(8, 16)))
                if mode.startswith("package"):
                    cct.disable()
                torch._dynamo.config.enable_compiler_collectives = False
    print(json.dumps({"rank": rank, "torch": torch.__version__, "raw": raw}), flush=True)
    dist.destroy_process_group()


def trace_rows(world: int, repeats: int, layers: int, modes) -> list:
    ranks = run_ranks(__file__, world, [repeats, layers, ",".join(modes)])
    p50 = statistics.median
    rows = []
    for case in CASES:
        row = {"what": case, "ranks": world, "layers": layers, "repeats": repeats,
               "torch": ranks[0]["torch"], "modes": list(modes)}
        for m in modes:
            wall = [max(r["raw"][case][m]["wall"][k] for r in ranks) for k in range(repeats)]
            cpu = [max(r["raw"][case][m]["cpu"][k] for r in ranks) for k in range(repeats)]
            row[f"{m}_wall_s"] = wall
            row[f"{m}_wall_s_p50"] = p50(wall)
            row[f"{m}_cpu_s_p50"] = p50(cpu)
            row[f"{m}_attempts"] = ranks[0]["raw"][case][m]["attempts"][0]
        for m in modes[1:]:
            # Paired compile by compile (the modes alternate), then the median.
            row[f"{m}_over_off_p50"] = p50(
                [a / b for a, b in zip(row[f"{m}_wall_s"], row["off_wall_s"])])
        rows.append(row)
    return rows


def warm_rows(runs: int) -> list:
    """train_lm.py at 2 ranks with Inductor: one run fills a fresh cache
    directory, then `runs` runs with the skip and as many without it,
    alternating, on that cache."""
    torchrun = pathlib.Path(sys.executable).with_name("torchrun")
    out = []
    with tempfile.TemporaryDirectory(prefix="ccol-restart-warm-") as d:
        env = dict(os.environ)
        env.update({"TORCHINDUCTOR_CACHE_DIR": f"{d}/cache", "OMP_NUM_THREADS": "1",
                    "GLOO_SOCKET_IFNAME": "lo"})
        order = ["on"] + ["on", "off"] * runs
        for i, skip in enumerate(order):
            report = f"{d}/run{i}"
            cmd = [str(torchrun), "--standalone", "--nproc-per-node", "2",
                   str(ROOT / "crates/python/examples/train_lm.py"), "--backend", "inductor",
                   "--steps", "2", "--skip-restart", skip, "--report", report]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                raise SystemExit(f"train_lm.py failed:\n{done.stderr[-4000:]}")
            ranks = [json.loads(pathlib.Path(f"{report}.{r}.json").read_text()) for r in (0, 1)]
            out.append({"run": i, "cache": "cold" if i == 0 else "warm", "skip_restart": skip,
                        "first_step_s": max(r["first_step_seconds"] for r in ranks),
                        "frame_compile_s": max(r["frame_compile_seconds"] for r in ranks),
                        "compile_steps": [r["compile_steps"] for r in ranks]})
    warm = [r for r in out if r["cache"] == "warm"]
    p50 = statistics.median
    summary = {"what": "warm", "runs": runs}
    for skip in ("on", "off"):
        these = [r for r in warm if r["skip_restart"] == skip]
        summary[f"skip_{skip}_first_step_s_p50"] = p50([r["first_step_s"] for r in these])
        summary[f"skip_{skip}_frame_compile_s_p50"] = p50([r["frame_compile_s"] for r in these])
    summary["runs_detail"] = out
    return [summary]


def print_rows(rows) -> None:
    for r in rows:
        if r["what"] == "warm":
            print(f"train_lm.py, 2 ranks, Inductor, warm cache (p50 of {r['runs']} runs each): "
                  f"frame compiles {r['skip_on_frame_compile_s_p50']:.2f} s with the skip, "
                  f"{r['skip_off_frame_compile_s_p50']:.2f} s without "
                  f"({r['skip_on_frame_compile_s_p50'] / r['skip_off_frame_compile_s_p50']:.2f}x); "
                  f"step 0 {r['skip_on_first_step_s_p50']:.2f} s and "
                  f"{r['skip_off_first_step_s_p50']:.2f} s")
            for d in r["runs_detail"]:
                print(f"  run {d['run']} ({d['cache']}, skip {d['skip_restart']}): step 0 "
                      f"{d['first_step_s']:.2f} s, frame compiles {d['frame_compile_s']:.2f} s")
            continue
        parts = []
        for m in r["modes"]:
            ratio = "" if m == "off" else f" = {r[f'{m}_over_off_p50']:.2f}x off"
            parts.append(f"{m} {r[f'{m}_wall_s_p50']:.3f} s{ratio} (cpu "
                         f"{r[f'{m}_cpu_s_p50']:.3f} s, {r[f'{m}_attempts']} attempts)")
        print(f"{r['what']}, {r['ranks']} ranks, {r['layers']} layers (p50 of {r['repeats']}, "
              f"slowest rank): " + "; ".join(parts))
    if rows and "torch" in rows[0]:
        print(f"(torch {rows[0]['torch']})")


def main(argv) -> int:
    if argv and argv[0] == "--worker":
        worker(int(argv[1]), int(argv[2]), argv[3], int(argv[4]), int(argv[5]),
               tuple(argv[6].split(",")))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,4", help="world sizes")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layers", type=int, default=120)
    ap.add_argument("--warm-runs", type=int, default=3, help="0: no train_lm.py runs")
    ap.add_argument("--with-restart-mode", action="store_true",
                    help="a fourth mode: the package with skip_restart=False")
    ap.add_argument("--json", action="store_true", help="one JSON line per row")
    a = ap.parse_args(argv)
    if a.repeats < 1 or a.layers < 2 or a.warm_runs < 0:
        ap.error("--repeats must be at least 1, --layers at least 2, --warm-runs at least 0")
    rows = []
    for w in (int(w) for w in a.ranks.split(",") if w):
        rows += trace_rows(w, a.repeats, a.layers,
                           MODES + ((RESTART_MODE,) if a.with_restart_mode else ()))
    if a.warm_runs:
        rows += warm_rows(a.warm_runs)
    return emit_rows(rows, a.json, print_rows)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
