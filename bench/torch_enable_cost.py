#!/usr/bin/env python3
"""What ``compiler_collectives.torch.enable()`` costs a job: its rendezvous,
and each compile's cost when every rank agrees, against PyTorch's own
exchange and against compiler collectives off.

Usage (in the torch environment, after ``scripts/setup-python.sh``)::

    "$CCOL_TORCH_PYTHON" bench/torch_enable_cost.py [--ranks 2,4,8]
        [--repeats 5] [--compile-ranks 2,4] [--sources 20] [--compiles 15] [--json]

For each world size of ``--ranks`` it starts that many rank processes (CPU
Gloo over a FileStore) and times ``enable()`` ``--repeats`` times (each
followed by ``disable()``; ranks start it together, after a barrier): the
version check (its cached reading), the package's own Gloo rendezvous
through the job's store, and the first exchange (the settings check). A
repeat's time is the slowest rank's.

For each world size of ``--compile-ranks`` every rank compiles, ``--compiles``
times per mode and in turn, a fresh function of ``--sources`` tensor
arguments of the same shapes on every rank (so every exchange agrees: the
package's digest fast path), with compiler collectives off, with PyTorch's
exchange (under the PyTorch oracle's one CPU patch) and with the package.
A compile's wall time is the slowest rank's; its step is Dynamo's own
``compiler_collective`` record, the last-arriving rank's. With collectives
on, Dynamo traces the frame twice (it restarts the analysis after the
exchange), so a compile costs the step plus a second trace more than with
them off; ``restart share`` is the part of that extra time that is not the
step — what no exchange, however fast, removes.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from torch_compiler_collective import emit_rows, join_job, run_ranks, use_exchange  # noqa: E402

MODES = ("off", "pytorch", "package")


def worker(rank: int, world: int, store: str, task: str, n: int, sources: int) -> None:
    import time

    import torch
    import torch.distributed as dist
    import torch._dynamo.output_graph as og

    original, patched = join_job(rank, world, store)
    import compiler_collectives.torch as cct
    from torch._dynamo.utils import compilation_time_metrics

    out = {"rank": rank, "torch": torch.__version__}
    if task == "enable":
        og.OutputGraph.run_compiler_collective = original
        times = []
        for _ in range(n):
            dist.barrier()
            start = time.perf_counter()
            cct.enable(timeout=120)
            times.append(time.perf_counter() - start)
            cct.disable()
        out["enable_s"] = times
    else:
        names = [f"x{i}" for i in range(sources)]
        body = "\n".join(f"    out = out + {v}.sum()" for v in names)
        inputs = [torch.zeros(4, 2) for _ in names]
        raw = {m: {"wall": [], "step": []} for m in MODES}
        for k in range(n):
            for mode in MODES:
                use_exchange(mode, original, patched)
                scope = {}
                code = f"def f({', '.join(names)}):\n    out = 0\n{body}\n    return out\n"
                exec(compile(code, f"<enable-cost-{mode}-{k}>", "exec"), scope)  # noqa: S102
                compiled = torch.compile(scope["f"], backend=lambda gm, _: gm.forward)
                compilation_time_metrics.pop("compiler_collective", None)
                dist.barrier()
                start = time.perf_counter()
                compiled(*inputs)
                raw[mode]["wall"].append(time.perf_counter() - start)
                got = compilation_time_metrics.get("compiler_collective", [])
                if len(got) != (0 if mode == "off" else 1):
                    raise SystemExit(f"rank {rank}, {mode}: compiler_collective steps {got}")
                raw[mode]["step"].append(got[0] if got else 0.0)
                if mode == "package":
                    cct.disable()
                torch._dynamo.config.enable_compiler_collectives = False
        out["raw"] = raw
    print(json.dumps(out), flush=True)
    dist.destroy_process_group()


def enable_row(world: int, repeats: int) -> dict:
    ranks = run_ranks(__file__, world, ["enable", repeats, 0])
    per = [max(r["enable_s"][k] for r in ranks) for k in range(repeats)]
    return {"what": "enable", "ranks": world, "repeats": repeats, "torch": ranks[0]["torch"],
            "enable_ms": [v * 1e3 for v in per],
            "enable_ms_p50": statistics.median(per) * 1e3}


def compile_row(world: int, sources: int, compiles: int) -> dict:
    ranks = run_ranks(__file__, world, ["compile", compiles, sources])
    p50 = statistics.median
    wall = {m: [max(r["raw"][m]["wall"][k] for r in ranks) for k in range(compiles)]
            for m in MODES}
    step = {m: [min(r["raw"][m]["step"][k] for r in ranks) for k in range(compiles)]
            for m in MODES}
    row = {"what": "compile", "ranks": world, "sources": sources, "compiles": compiles,
           "torch": ranks[0]["torch"]}
    for m in MODES:
        row[f"{m}_wall_ms_p50"] = p50(wall[m]) * 1e3
        row[f"{m}_step_ms_p50"] = p50(step[m]) * 1e3
        row[f"{m}_wall_ms"] = [v * 1e3 for v in wall[m]]
    for m in ("pytorch", "package"):
        # Per compile: the extra wall time over the same compile with
        # collectives off, and the share of it that is not the step.
        extra = [w - o for w, o in zip(wall[m], wall["off"])]
        row[f"{m}_extra_ms_p50"] = p50(extra) * 1e3
        shares = [(e - s) / e for e, s in zip(extra, step[m]) if e > 0]
        row[f"{m}_restart_share_p50"] = p50(shares) if shares else float("nan")
    return row


def print_rows(rows) -> None:
    for r in rows:
        if r["what"] == "enable":
            ms = " ".join(f"{v:.0f}" for v in r["enable_ms"])
            print(f"enable(), {r['ranks']} ranks: p50 {r['enable_ms_p50']:.0f} ms "
                  f"(each repeat, slowest rank: {ms} ms)")
    for r in rows:
        if r["what"] == "compile":
            print(f"compile, {r['ranks']} ranks x {r['sources']} sources, every rank agreeing "
                  f"(p50 of {r['compiles']}, wall = slowest rank): "
                  f"off {r['off_wall_ms_p50']:.1f} ms; "
                  f"PyTorch's exchange {r['pytorch_wall_ms_p50']:.1f} ms "
                  f"(step {r['pytorch_step_ms_p50']:.2f}, +{r['pytorch_extra_ms_p50']:.1f} over off, "
                  f"restart share {r['pytorch_restart_share_p50']:.0%}); "
                  f"package {r['package_wall_ms_p50']:.1f} ms "
                  f"(step {r['package_step_ms_p50']:.2f}, +{r['package_extra_ms_p50']:.1f} over off, "
                  f"restart share {r['package_restart_share_p50']:.0%})")
    if rows:
        print(f"(torch {rows[0]['torch']})")


def main(argv) -> int:
    if argv and argv[0] == "--worker":
        worker(int(argv[1]), int(argv[2]), argv[3], argv[4], int(argv[5]), int(argv[6]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,4,8", help="world sizes for enable()'s rendezvous")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--compile-ranks", default="2,4", help="world sizes for the compile cost")
    ap.add_argument("--sources", type=int, default=20)
    ap.add_argument("--compiles", type=int, default=15)
    ap.add_argument("--json", action="store_true", help="one JSON line per row")
    a = ap.parse_args(argv)
    if a.repeats < 1 or a.compiles < 1 or a.sources < 1:
        ap.error("--repeats, --compiles and --sources must be at least 1")
    rows = [enable_row(int(w), a.repeats) for w in a.ranks.split(",") if w]
    rows += [compile_row(int(w), a.sources, a.compiles) for w in a.compile_ranks.split(",") if w]
    return emit_rows(rows, a.json, print_rows)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
