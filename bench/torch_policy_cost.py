#!/usr/bin/env python3
"""What the agreement policy costs a job (docs/performance.md, "The
agreement policy's cost"): a guard vote per training step, and the time to
the first step.

Usage (in the torch environment, after ``scripts/setup-python.sh``)::

    "$CCOL_TORCH_PYTHON" bench/torch_policy_cost.py [--rounds 5] [--steps 300]
        [--first-step-rounds 3] [--json]

**A vote per step.** Two rank processes (CPU Gloo over a FileStore) train
a step whose compiled graph holds a functional all-reduce (a 64x64 linear
layer on a batch of 32 rows, its output all-reduced, then the loss), with
``aot_eager``, in three modes: without the package, with the package and
``guard_votes=False``, and with the default (``"auto"``: the all-reduce
turns votes on at the first compile, so every call votes). Each round runs
each mode in turn (a fresh ``enable``, ``torch._dynamo.reset()``), 20
warm-up steps, then ``--steps`` timed steps; a step's time is the slowest
rank's, per round the median; the table gives the median over rounds.

**Time to the first step.** ``crates/python/examples/train_lm.py`` under
``torchrun --nproc-per-node 2`` (fresh processes each time), with and
without the package, alternating, ``--first-step-rounds`` each: from the
launch to the end of step 0 on the slowest rank (``aot_eager``).
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
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from torch_compiler_collective import run_ranks  # noqa: E402

EXAMPLE = HERE.parent / "crates" / "python" / "examples" / "train_lm.py"
MODES = ("none", "package, no votes", "package, votes (default)")
WARMUP = 20


def worker(rank: int, world: int, store: str, rounds: int, steps: int) -> None:
    import datetime

    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(minutes=10))
    import compiler_collectives.torch as cct

    torch.manual_seed(0)
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64)

    def step(w, x):
        y = funcol.all_reduce(x @ w, "sum", dist.group.WORLD) / world
        return y.pow(2).mean()

    times = {m: [] for m in MODES}
    for _ in range(rounds):
        for mode in MODES:
            torch._dynamo.reset()
            if mode != "none":
                cct.enable(timeout=120, guard_votes=False if "no votes" in mode else "auto")
            compiled = torch.compile(step, backend="aot_eager")
            per_step = []
            for i in range(WARMUP + steps):
                dist.barrier()
                start = time.perf_counter()
                loss = compiled(w, x)
                loss.backward()
                with torch.no_grad():
                    w -= 0.01 * w.grad
                    w.grad = None
                if i >= WARMUP:
                    per_step.append(time.perf_counter() - start)
            info = cct.channel_info()
            times[mode].append({"steps": per_step, "votes_on": bool(info and info["votes_on"])})
            cct.disable()
    print(json.dumps({"rank": rank, "torch": torch.__version__, "times": times}))


def vote_row(rounds: int, steps: int) -> dict:
    ranks = run_ranks(str(pathlib.Path(__file__).resolve()), 2, [rounds, steps])
    row = {"what": "vote per step", "ranks": 2, "torch": ranks[0]["torch"]}
    for mode in MODES:
        medians = []
        for r in range(rounds):
            slowest = [max(t) for t in zip(*(k["times"][mode][r]["steps"] for k in ranks))]
            medians.append(statistics.median(slowest))
        row[mode] = statistics.median(medians) * 1e6
        row[mode + " votes_on"] = ranks[0]["times"][mode][0]["votes_on"]
    row["vote us"] = row[MODES[2]] - row[MODES[1]]
    return row


def first_step(exchange: str, report: pathlib.Path) -> float:
    env = dict(os.environ)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env["OMP_NUM_THREADS"] = "1"
    torchrun = pathlib.Path(sys.executable).parent / "torchrun"
    start = time.time()
    subprocess.run([str(torchrun), "--standalone", "--nproc-per-node=2", str(EXAMPLE),
                    "--steps", "1", "--exchange", exchange, "--report", str(report)],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=600)
    ends = [json.loads(pathlib.Path(f"{report}.{r}.json").read_text())["first_step_end"]
            for r in range(2)]
    return max(ends) - start


def first_step_row(rounds: int) -> dict:
    times = {"none": [], "package": []}
    with tempfile.TemporaryDirectory(prefix="ccol-bench-") as d:
        for i in range(rounds):
            for exchange in times:
                times[exchange].append(first_step(exchange, pathlib.Path(d) / f"{exchange}{i}"))
    row = {"what": "time to the first step", "ranks": 2,
           "none s": statistics.median(times["none"]),
           "package s": statistics.median(times["package"]),
           "runs": times}
    row["package / none"] = row["package s"] / row["none s"]
    return row


def main(argv) -> int:
    if argv and argv[0] == "--worker":
        worker(int(argv[1]), int(argv[2]), argv[3], int(argv[4]), int(argv[5]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--first-step-rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="one JSON line per row")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.steps < 1 or a.first_step_rounds < 0:
        ap.error("--rounds and --steps must be at least 1")
    rows = [vote_row(a.rounds, a.steps)]
    if a.first_step_rounds:
        rows.append(first_step_row(a.first_step_rounds))
    if a.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    v = rows[0]
    print(f"A training step with a functional all-reduce, 2 ranks, torch {v['torch']} "
          f"(median over {a.rounds} rounds of {a.steps} steps, slowest rank):")
    for mode in MODES:
        print(f"  {mode:26s} {v[mode]:8.1f} us  (votes on: {v[mode + ' votes_on']})")
    print(f"  a vote adds {v['vote us']:.1f} us per step")
    if len(rows) > 1:
        f = rows[1]
        print(f"Time to the end of the first step, train_lm.py, 2 ranks (median of "
              f"{a.first_step_rounds}): without the package {f['none s']:.2f} s, with it "
              f"{f['package s']:.2f} s ({f['package / none']:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
