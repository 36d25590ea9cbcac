#!/usr/bin/env python3
"""Cold start of a training step with Inductor, PyTorch alone against the
package's ``compile_once`` (docs/python.md, "Compile once"), alternating in
one run. Not a test.

Usage (in the torch environment, after ``scripts/setup-python.sh``)::

    "$CCOL_TORCH_PYTHON" bench/torch_compile_once.py [--case node,two_nodes,warm_cold]
        [--ranks 2,4] [--repeats 3] [--pieces 3] [--width 64] [--limit 600] [--json]

Each job is ``torchrun`` running this file as its worker: a model of
``--pieces`` pieces (a graph break between each: one Inductor forward and
one backward graph per piece), each a Linear(width, width) and a ReLU, one
training step with DDP-style gradients (an all_reduce of each gradient after
``backward()``), compiled by Inductor on CPU. Every job starts cold: each
simulated node gets a fresh ``TORCHINDUCTOR_CACHE_DIR`` and its own
``TMPDIR`` (Inductor keeps its precompiled headers under the default cache
directory, outside ``TORCHINDUCTOR_CACHE_DIR``). Modes, in turn within each
repeat (each repeat starts with the next one):

- ``pytorch``: PyTorch alone;
- ``package``: ``compiler_collectives.torch.enable(compile_once=True)``;
- ``sync`` (``warm_cold`` only, torch 2.15): PyTorch alone with
  ``torch._functorch.config._sync_cache_decision_cross_ranks``.

Cases:

- ``node``: one node, ``--ranks`` ranks (``torchrun --nproc-per-node N``),
  one cache directory;
- ``two_nodes``: two ``torchrun`` agents (``--nnodes 2``, 2 ranks each), each
  node its own cache directory and TMPDIR, both on this machine's CPUs;
- ``warm_cold``: as ``two_nodes``, node 0's cache warmed first by a job of
  PyTorch alone on that node's directory, node 1's cold.

Reported per job: the time to the end of the first step on the slowest
rank (and each node's slowest), the Inductor compiles in the whole job,
counted here, outside the package and the caches (each compile creates one
``GraphLowering``), the package's counters summed over the ranks (bytes
sent), the losses (rank 0's, to compare modes), and any rank that did not
finish within ``--limit`` seconds (reported as such: PyTorch's vote
deadlocks now and then on CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODES = ("pytorch", "package")


def worker(args) -> None:
    """One rank, under torchrun: the training step, then its report."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import torch._inductor.graph as inductor_graph

    lowerings = [0]
    init = inductor_graph.GraphLowering.__init__

    def counting(self, *a, **kw):
        lowerings[0] += 1
        init(self, *a, **kw)

    inductor_graph.GraphLowering.__init__ = counting
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.mode == "sync":
        import torch._functorch.config as functorch_config

        functorch_config._sync_cache_decision_cross_ranks = True
    if args.mode == "package":
        import compiler_collectives.torch as cct

        cct.enable(compile_once=True)
    torch.manual_seed(0)
    pieces = [nn.Linear(args.width, args.width) for _ in range(args.pieces)]
    params = [p for m in pieces for p in m.parameters()]

    def piece(i, x):
        return torch.relu(pieces[i](x)) * (i + 1)

    # The graph breaks unrolled (Dynamo skips a frame whose loop breaks).
    body = "    x = piece(0, x)\n" + "".join(
        f"    torch._dynamo.graph_break()\n    x = piece({i}, x)\n" for i in range(1, args.pieces))
    scope = {"piece": piece, "torch": torch}
    exec(compile(f"def forward(x):\n{body}    return x.square().mean()\n",  # noqa: S102
                 "<bench model>", "exec"), scope)
    forward = torch.compile(scope["forward"], backend="inductor")
    dist.barrier()
    started = time.perf_counter()
    g = torch.Generator().manual_seed(rank)
    loss = forward(torch.randn(8, args.width, generator=g))
    loss.backward()
    for p in params:
        dist.all_reduce(p.grad)
    first_step = time.perf_counter() - started
    from torch._dynamo.utils import counters

    report = {"rank": rank, "node": int(os.environ.get("GROUP_RANK", "0")),
              "first_step": first_step, "lowerings": lowerings[0], "loss": float.hex(loss.item()),
              "package": dict(counters["compiler_collectives"])}
    pathlib.Path(args.out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job(case: str, mode: str, ranks: int, args, work: pathlib.Path, warm: dict) -> dict:
    """Runs one job of `case` in `mode`; returns its row."""
    out = pathlib.Path(tempfile.mkdtemp(dir=work, prefix=f"{case}-{mode}-"))
    nodes = 1 if case == "node" else 2
    per_node = ranks if case == "node" else 2
    torchrun = pathlib.Path(sys.executable).with_name("torchrun")
    port = _free_port()
    procs = []
    for node in range(nodes):
        cache = out / f"node{node}-cache"
        tmp = out / f"node{node}-tmp"
        tmp.mkdir()
        if node in warm:
            shutil.copytree(warm[node]["cache"], cache)
            shutil.copytree(warm[node]["tmp"], tmp, dirs_exist_ok=True)
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache), TMPDIR=str(tmp),
                   GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        cmd = [str(torchrun), f"--nproc-per-node={per_node}"]
        if nodes == 1:
            cmd += ["--standalone"]
        else:
            cmd += [f"--nnodes={nodes}", f"--node-rank={node}", "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=bench{port}"]
        cmd += [__file__, "--worker", "--mode", mode, "--out", str(out),
                "--pieces", str(args.pieces), "--width", str(args.width)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + args.limit
    stuck = False
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            stuck = True
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    reports = [json.loads(f.read_text()) for f in sorted(out.glob("rank*.json"))]
    row = {"case": case, "mode": mode, "ranks": nodes * per_node, "finished": len(reports),
           "deadlocked_or_failed": stuck or len(reports) < nodes * per_node,
           "returncodes": [p.returncode for p in procs]}
    if reports:
        row["first_step_s"] = max(r["first_step"] for r in reports)
        row["first_step_by_node_s"] = {
            n: max(r["first_step"] for r in reports if r["node"] == n)
            for n in sorted({r["node"] for r in reports})}
        row["lowerings"] = sum(r["lowerings"] for r in reports)
        row["lowerings_by_node"] = {
            n: sum(r["lowerings"] for r in reports if r["node"] == n)
            for n in sorted({r["node"] for r in reports})}
        package: dict = {}
        for r in reports:
            for k, v in r["package"].items():
                package[k] = package.get(k, 0) + v
        row["package"] = package
        row["loss_rank0"] = next((r["loss"] for r in reports if r["rank"] == 0), None)
    if row["deadlocked_or_failed"]:
        row["output_tail"] = [p.stdout.read()[-2000:] if p.stdout else "" for p in procs]
    return row


def warm_node(args, work: pathlib.Path) -> dict:
    """Node 0's directories after a one-node job of PyTorch alone (2 ranks)."""
    out = pathlib.Path(tempfile.mkdtemp(dir=work, prefix="warmup-"))
    cache, tmp = out / "cache", out / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache), TMPDIR=str(tmp),
               GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    torchrun = pathlib.Path(sys.executable).with_name("torchrun")
    subprocess.run([str(torchrun), "--standalone", "--nproc-per-node=2", __file__, "--worker",
                    "--mode", "pytorch", "--out", str(out), "--pieces", str(args.pieces),
                    "--width", str(args.width)], env=env, check=True, capture_output=True,
                   timeout=args.limit)
    return {0: {"cache": cache, "tmp": tmp}}


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="pytorch", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--case", default="node,two_nodes,warm_cold")
    ap.add_argument("--ranks", default="2,4", help="world sizes of the node case")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pieces", type=int, default=3)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--limit", type=float, default=600, help="seconds a job may take")
    ap.add_argument("--json", action="store_true", help="one JSON row per job")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="ccol-bench-compile-once-") as tmp:
        work = pathlib.Path(tmp)
        for case in args.case.split(","):
            sizes = [int(n) for n in args.ranks.split(",")] if case == "node" else [4]
            modes = MODES + (("sync",) if case == "warm_cold" else ())
            for ranks in sizes:
                for repeat in range(args.repeats):
                    warm = warm_node(args, work) if case == "warm_cold" else {}
                    turn = repeat % len(modes)
                    for mode in modes[turn:] + modes[:turn]:
                        row = job(case, mode, ranks, args, work, warm)
                        row["repeat"] = repeat
                        rows.append(row)
                        print(json.dumps(row) if args.json else _line(row), flush=True)
    if not args.json:
        _summary(rows)
    return 0


def _line(row) -> str:
    if row.get("first_step_s") is None:
        return f"{row['case']:9} {row['ranks']} ranks {row['mode']:8} DID NOT FINISH {row}"
    pkg = row.get("package", {})
    return (f"{row['case']:9} {row['ranks']} ranks {row['mode']:8} first step "
            f"{row['first_step_s']:6.2f} s (by node {row['first_step_by_node_s']}), "
            f"{row['lowerings']:3d} Inductor compiles (by node {row['lowerings_by_node']}), "
            f"{pkg.get('compile_once_bytes_sent', 0)} bytes sent"
            + ("  DEADLOCK/FAILED" if row["deadlocked_or_failed"] else ""))


def _summary(rows) -> None:
    print("\nPyTorch ÷ package, time to the first step (slowest rank), per repeat:")
    keys = sorted({(r["case"], r["ranks"]) for r in rows})
    for case, ranks in keys:
        ratios = []
        for rep in sorted({r["repeat"] for r in rows}):
            by = {r["mode"]: r for r in rows
                  if (r["case"], r["ranks"], r["repeat"]) == (case, ranks, rep)}
            a, b = by.get("pytorch", {}).get("first_step_s"), by.get("package", {}).get(
                "first_step_s")
            if a and b:
                ratios.append(a / b)
        if ratios:
            print(f"  {case} {ranks} ranks: " + ", ".join(f"{x:.2f}" for x in ratios)
                  + f" (median {statistics.median(ratios):.2f})")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
