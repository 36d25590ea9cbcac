#!/usr/bin/env python3
"""Cold start of a training step with Inductor, PyTorch alone against the
package's ``compile_once`` (docs/python.md, "Compile once"), alternating in
one run. Not a test.

Usage (in the torch environment, after ``scripts/setup-python.sh``)::

    "$CCOL_TORCH_PYTHON" bench/torch_compile_once.py [--case node,two_nodes,warm_cold]
        [--ranks 2,4] [--repeats 3] [--pieces 3] [--width 64] [--limit 600] [--json]
    "$CCOL_TORCH_PYTHON" bench/torch_compile_once.py --case shard [--layers 48] [--repeats 3]

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
  ``torch._functorch.config._sync_cache_decision_cross_ranks``;
- ``shard`` (``shard`` only): ``enable(compile_once=True, shard_kernels=True)``.

Cases:

- ``node``: one node, ``--ranks`` ranks (``torchrun --nproc-per-node N``),
  one cache directory;
- ``two_nodes``: two ``torchrun`` agents (``--nnodes 2``, 2 ranks each), each
  node its own cache directory and TMPDIR, both on this machine's CPUs;
- ``warm_cold``: as ``two_nodes``, node 0's cache warmed first by a job of
  PyTorch alone on that node's directory, node 1's cold;
- ``shard``: the job's kernel builds on N machines, simulated on this one:
  two ``torchrun`` agents of one rank each, each rank pinned to its own
  core (``os.sched_setaffinity``), ``compile_threads=2``, each "node" its
  own cache directory and TMPDIR. The model is one piece (unless
  ``--pieces`` is given) of ``--layers`` Linear layers (default
  :data:`SHARD_LAYERS`; each followed by a ReLU: one C++ kernel per layer in
  the forward graph, and about two in the backward). Modes: PyTorch alone,
  ``compile_once`` alone, and ``compile_once`` with ``shard_kernels``.
  First, the model's kernel share f under the same conditions (one rank,
  pinned, ``compile_threads=2``): the time to the first step rebuilding only
  the kernels' shared objects (a cache holding the model's entries, its
  ``.so`` files removed, a fresh TMPDIR so that the precompiled header is
  built again), divided by a cold compile's; the ideal gain of sharding at
  two ranks is 1 / (1 - f/2). f counts two costs every node pays once
  whatever sharding does: the precompiled header (built before a node's
  first kernel, without which each kernel takes several times longer) and
  the vector-ISA probe. So the bench also measures f_k, the same rebuild
  with those two kept: the share of the kernels' own builds, and
  1 / (1 - f_k/2) the gain sharding can reach.

Reported per job: the time to the end of the first step on the slowest
rank (and each node's slowest), the Inductor compiles in the whole job,
counted here, outside the package and the caches (each compile creates one
``GraphLowering``), the kernels' shared objects built in the whole job
(counted at Inductor's C++ builder), the package's counters summed over the ranks (bytes
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
#: --case shard's model: Linear layers in one piece (94 kernels). Its
#: kernels' own builds (f_k) then take 0.8 to 0.9 of a cold compile here, so
#: that the node's fixed costs (module docs) weigh less in f than with 12
#: layers (f_k 0.5 to 0.8).
SHARD_LAYERS = 48


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
    import torch._inductor.cpp_builder as cpp_builder

    builds: list = []
    build = cpp_builder.CppBuilder.build

    def counting_build(self, *a, **kw):
        target = self.get_target_file_path()
        if target.endswith(".main.so"):
            builds.append(os.path.basename(target))
        return build(self, *a, **kw)

    cpp_builder.CppBuilder.build = counting_build
    if args.pin:
        os.sched_setaffinity(0, {int(os.environ.get("GROUP_RANK", "0")) % os.cpu_count()})
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.mode == "sync":
        import torch._functorch.config as functorch_config

        functorch_config._sync_cache_decision_cross_ranks = True
    if args.mode in ("package", "shard"):
        import compiler_collectives.torch as cct

        cct.enable(compile_once=True, shard_kernels=args.mode == "shard")
    torch.manual_seed(0)
    pieces = [nn.Sequential(*(nn.Linear(args.width, args.width) for _ in range(args.layers)))
              for _ in range(args.pieces)]
    params = [p for m in pieces for p in m.parameters()]

    def piece(i, x):
        for j, layer in enumerate(pieces[i]):
            # A constant of its own makes each layer's kernel distinct; past
            # 12 layers a smaller one keeps the loss finite (the models of
            # 12 layers or fewer are unchanged).
            x = torch.relu(layer(x)) * ((i + j + 1) if j < 12 else (i + j + 1) / 16)
        return x

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
              "builds": builds,
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
    nodes = 1 if case in ("node", "share") else 2
    per_node = ranks if case == "node" else 1 if case in ("shard", "share") else 2
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
        if case in ("shard", "share"):
            env["TORCHINDUCTOR_COMPILE_THREADS"] = "2"
        cmd = [str(torchrun), f"--nproc-per-node={per_node}"]
        if nodes == 1:
            cmd += ["--standalone"]
        else:
            cmd += [f"--nnodes={nodes}", f"--node-rank={node}", "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=bench{port}"]
        cmd += [__file__, "--worker", "--mode", mode, "--out", str(out),
                "--pieces", str(args.pieces), "--width", str(args.width),
                "--layers", str(args.layers)] + (["--pin"] if case in ("shard", "share") else [])
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
           "out": str(out),
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
        built = [b for r in reports for b in r["builds"]]
        row["kernel_builds"], row["distinct_kernels"] = len(built), len(set(built))
        row["kernel_builds_by_rank"] = {r["rank"]: len(r["builds"]) for r in reports}
    if row["deadlocked_or_failed"]:
        row["output_tail"] = [p.stdout.read()[-2000:] if p.stdout else "" for p in procs]
    return row


def kernel_share(args, work: pathlib.Path) -> dict:
    """The model's kernel share f (module docs): a cold compile of one rank,
    then the same with only the kernels' shared objects to rebuild; and f_k,
    the same with the node's fixed costs kept (the precompiled header in
    TMPDIR, the vector-ISA probe's library in the cache directory): the
    share of the kernels' own builds, the part sharding can spread."""
    cold = job("share", "pytorch", 1, args, work, {})
    rebuilds = {}
    for name, keep_fixed in (("rebuild", False), ("kernels", True)):
        base = pathlib.Path(tempfile.mkdtemp(dir=work, prefix="share-"))
        cache, tmp = base / "cache", base / "tmp"
        shutil.copytree(pathlib.Path(cold["out"], "node0-cache"), cache)
        if keep_fixed:
            shutil.copytree(pathlib.Path(cold["out"], "node0-tmp"), tmp)
        else:
            tmp.mkdir()
        for f in list(cache.rglob("*.so")) + list(cache.rglob("*.o")):
            if not keep_fixed or ".main." in f.name or f.suffix == ".o":
                f.unlink()
        rebuilds[name] = job("share", "pytorch", 1, args, work,
                             {0: {"cache": cache, "tmp": tmp}})
    rebuild, kernels = rebuilds["rebuild"], rebuilds["kernels"]

    def share(row):
        if cold.get("first_step_s") and row.get("first_step_s"):
            return row["first_step_s"] / cold["first_step_s"]
        return None

    return {"case": "kernel_share", "cold_s": cold.get("first_step_s"),
            "rebuild_s": rebuild.get("first_step_s"),
            "kernels_only_s": kernels.get("first_step_s"),
            "cold_lowerings": cold.get("lowerings"),
            "rebuild_lowerings": rebuild.get("lowerings"),
            "kernels": cold.get("distinct_kernels"), "rebuilt": rebuild.get("kernel_builds"),
            "rebuilt_kernels_only": kernels.get("kernel_builds"),
            "f": share(rebuild), "f_k": share(kernels)}


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
    ap.add_argument("--layers", type=int, default=1,
                    help="Linear layers per piece (--case shard: default SHARD_LAYERS, "
                         "one piece)")
    ap.add_argument("--pin", action="store_true", help=argparse.SUPPRESS)
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
            sizes = [int(n) for n in args.ranks.split(",")] if case == "node" else [
                2 if case == "shard" else 4]
            modes = MODES + (("sync",) if case == "warm_cold" else ("shard",)
                             if case == "shard" else ())
            if case == "shard":
                # One piece unless --pieces says otherwise: with more, the
                # later pieces' kernels are mostly the first's, built once.
                if "--layers" not in argv:
                    args.layers = SHARD_LAYERS
                if "--pieces" not in argv:
                    args.pieces = 1
            for ranks in sizes:
                for repeat in range(args.repeats):
                    warm = warm_node(args, work) if case == "warm_cold" else {}
                    if case == "shard":
                        share = kernel_share(args, work)
                        share["repeat"] = repeat
                        rows.append(share)
                        print(json.dumps(share) if args.json else
                              f"kernel share f = {share['f']:.3f} (cold {share['cold_s']:.2f} s, "
                              f"rebuilding {share['rebuilt']} of {share['kernels']} kernels "
                              f"{share['rebuild_s']:.2f} s); f_k = {share['f_k']:.3f} (the "
                              f"fixed costs kept: {share['kernels_only_s']:.2f} s, "
                              f"{share['rebuilt_kernels_only']} kernels)", flush=True)
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
    if row.get("case") == "shard" and row.get("first_step_s") is not None:
        return (f"shard     2 ranks {row['mode']:8} first step {row['first_step_s']:6.2f} s, "
                f"{row['lowerings']:3d} Inductor compiles, {row['kernel_builds']} kernel builds "
                f"({row['distinct_kernels']} distinct; by rank {row['kernel_builds_by_rank']}), "
                f"loss {row['loss_rank0']}"
                + ("  DEADLOCK/FAILED" if row["deadlocked_or_failed"] else ""))
    if row.get("first_step_s") is None:
        return f"{row['case']:9} {row['ranks']} ranks {row['mode']:8} DID NOT FINISH {row}"
    pkg = row.get("package", {})
    return (f"{row['case']:9} {row['ranks']} ranks {row['mode']:8} first step "
            f"{row['first_step_s']:6.2f} s (by node {row['first_step_by_node_s']}), "
            f"{row['lowerings']:3d} Inductor compiles (by node {row['lowerings_by_node']}), "
            f"{pkg.get('compile_once_bytes_sent', 0)} bytes sent"
            + ("  DEADLOCK/FAILED" if row["deadlocked_or_failed"] else ""))


def _summary(rows) -> None:
    shares = [r["f"] for r in rows if r["case"] == "kernel_share" and r.get("f")]
    if shares:
        f = statistics.median(shares)
        ideal = 1 / (1 - f / 2)
        print(f"\nkernel share f: {', '.join(f'{x:.3f}' for x in shares)} (median {f:.3f}); "
              f"ideal gain at 2 ranks {ideal:.2f}, target 0.8x = {0.8 * ideal:.2f}")
        kept = [r["f_k"] for r in rows if r["case"] == "kernel_share" and r.get("f_k")]
        if kept:
            f_k = statistics.median(kept)
            print(f"kernels-only share f_k: {', '.join(f'{x:.3f}' for x in kept)} (median "
                  f"{f_k:.3f}); ideal gain at 2 ranks {1 / (1 - f_k / 2):.2f}")
        for rep in sorted({r["repeat"] for r in rows if r["case"] == "shard"}):
            by = {r["mode"]: r.get("first_step_s") for r in rows
                  if r["case"] == "shard" and r["repeat"] == rep}
            if all(by.get(m) for m in ("pytorch", "package", "shard")):
                print(f"  repeat {rep}: PyTorch ÷ sharded {by['pytorch'] / by['shard']:.2f}, "
                      f"compile_once alone ÷ sharded {by['package'] / by['shard']:.2f}")
    print("\nPyTorch ÷ package, time to the first step (slowest rank), per repeat:")
    keys = sorted({(r["case"], r["ranks"]) for r in rows if r["case"] != "kernel_share"})
    for case, ranks in keys:
        ratios = []
        for rep in sorted({r["repeat"] for r in rows}):
            by = {r["mode"]: r for r in rows
                  if (r["case"], r.get("ranks"), r["repeat"]) == (case, ranks, rep)}
            a, b = by.get("pytorch", {}).get("first_step_s"), by.get("package", {}).get(
                "first_step_s")
            if a and b:
                ratios.append(a / b)
        if ratios:
            print(f"  {case} {ranks} ranks: " + ", ".join(f"{x:.2f}" for x in ratios)
                  + f" (median {statistics.median(ratios):.2f})")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
