#!/usr/bin/env python3
"""The time Dynamo spends in its ``compiler_collective`` step: PyTorch 2.13's
own exchange against the compiler_collectives package, in one run.

Usage (in the torch environment, after ``scripts/setup-python.sh``)::

    "$CCOL_TORCH_PYTHON" bench/torch_compiler_collective.py [--ranks 2,4]
        [--sources 20,200] [--compiles 15] [--json]

For each world size it starts that many rank processes (CPU Gloo over a
FileStore, ``cpu:gloo``), and each rank compiles, ``--compiles`` times per
exchange, a fresh function of ``--sources`` tensor arguments, a third of
them with a rank-dependent dim 0 (so the ranks' states differ and the full
exchange runs; ``--states same``: every rank the same shapes, where the
package's digest round suffices) — alternating PyTorch's exchange and the package's, compile
by compile, so that noise hits both alike. Dynamo times the step itself
(``dynamo_timed("compiler_collective")``, read from
``torch._dynamo.utils.compilation_time_metrics``): for PyTorch, the
``all_gather_object`` of the ``LocalState`` (pickling included) under the
PyTorch oracle's one CPU patch (tests/pytorch-oracle/README.md); for the
package, its exchange (conversion included). A compile's time is that of
the last rank to arrive (the others also wait for it to finish tracing);
the table gives medians and their ratio, PyTorch / package, and the
slowest rank's medians beside them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def patch_pytorch_exchange() -> None:
    spec = importlib.util.spec_from_file_location(
        "ccol_oracle_harness", ROOT / "tests/pytorch-oracle/harness.py"
    )
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    harness._patch_compiler_collective_device_context()


def worker(rank: int, world: int, store: str, sources: int, compiles: int, states: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    import torch._dynamo.output_graph as og

    # PyTorch's exchange runs patched; the package checks (and replaces) the
    # unpatched method, so each mode gets its own.
    original = og.OutputGraph.__dict__["run_compiler_collective"]
    patch_pytorch_exchange()
    patched = og.OutputGraph.__dict__["run_compiler_collective"]
    dist.init_process_group("cpu:gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(minutes=10))
    import compiler_collectives.torch as cct
    from torch._dynamo.utils import compilation_time_metrics

    names = [f"x{i}" for i in range(sources)]
    body = "\n".join(f"    out = out + {n}.sum()" for n in names)
    inputs = [
        torch.zeros(4 + (rank if i % 3 == 0 and states == "differ" else 0), 2)
        for i in range(sources)
    ]

    def backend(gm, example_inputs):
        return gm.forward

    # The exchange call alone, inside the step: PyTorch's all_gather_object
    # on its compile group, the package's exchange_local_state.
    calls = []
    import time as _time

    from torch._dynamo import distributed as dd

    real_gather = dist.all_gather_object

    def timed_gather(object_list, obj, group=None):
        start = _time.perf_counter()
        out = real_gather(object_list, obj, group=group)
        if group is not None and group is dd._COMPILE_PG:
            calls.append(_time.perf_counter() - start)
        return out

    dist.all_gather_object = timed_gather

    class TimedChannel:
        def __init__(self, channel):
            self.channel = channel

        def exchange_local_state(self, key, local_state):
            start = _time.perf_counter()
            out = self.channel.exchange_local_state(key, local_state)
            calls.append(_time.perf_counter() - start)
            return out

        def __getattr__(self, name):
            return getattr(self.channel, name)

    times = {"pytorch": [], "package": []}
    exchange = {"pytorch": [], "package": []}
    for k in range(compiles):
        for mode in ("pytorch", "package"):
            torch._dynamo.reset()
            if mode == "package":
                og.OutputGraph.run_compiler_collective = original
                cct.enable(timeout=120)
                cct._state.channel = TimedChannel(cct._state.channel)
            else:
                og.OutputGraph.run_compiler_collective = patched
                torch._dynamo.config.enable_compiler_collectives = True
            scope = {}
            code = f"def f({', '.join(names)}):\n    out = 0\n{body}\n    return out\n"
            exec(compile(code, f"<bench-{mode}-{k}>", "exec"), scope)  # noqa: S102
            compilation_time_metrics.pop("compiler_collective", None)
            calls.clear()
            dist.barrier()
            torch.compile(scope["f"], backend=backend)(*inputs)
            got = compilation_time_metrics.get("compiler_collective", [])
            if len(got) != 1:
                raise SystemExit(f"rank {rank}: expected one compiler_collective step, saw {got}")
            times[mode].append(got[0])
            exchange[mode].append(calls[0] if len(calls) == 1 else float("nan"))
            if mode == "package":
                cct.disable()
            torch._dynamo.config.enable_compiler_collectives = False
    print(json.dumps({"rank": rank, "times": times, "exchange": exchange}), flush=True)
    dist.destroy_process_group()


def run_world(world: int, sources: int, compiles: int, states: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="ccol-bench-") as d:
        env = dict(os.environ)
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env["OMP_NUM_THREADS"] = "1"
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker", str(r), str(world), f"{d}/store",
                 str(sources), str(compiles), states],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            )
            for r in range(world)
        ]
        ranks = []
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=1800)
            if p.returncode != 0:
                raise SystemExit(f"rank {r} failed (exit {p.returncode}):\n{err[-4000:]}")
            ranks.append(json.loads(out.strip().splitlines()[-1]))
    # A rank's time in the step includes waiting for slower ranks to finish
    # tracing; the last rank to arrive waits least: its time is the
    # exchange's own cost. Both are reported.
    def p50(mode, pick, what="times"):
        return statistics.median(
            pick(r[what][mode][k] for r in ranks) for k in range(compiles)
        )

    own = {m: p50(m, min) for m in ("pytorch", "package")}
    slowest = {m: p50(m, max) for m in ("pytorch", "package")}
    call = {m: p50(m, min, "exchange") for m in ("pytorch", "package")}
    return {
        "ranks": world,
        "sources": sources,
        "states": states,
        "compiles": compiles,
        "pytorch_ms_p50": own["pytorch"] * 1e3,
        "package_ms_p50": own["package"] * 1e3,
        "pytorch_over_package": own["pytorch"] / own["package"],
        "pytorch_exchange_call_ms_p50": call["pytorch"] * 1e3,
        "package_exchange_call_ms_p50": call["package"] * 1e3,
        "exchange_call_pytorch_over_package": call["pytorch"] / call["package"],
        "pytorch_slowest_rank_ms_p50": slowest["pytorch"] * 1e3,
        "package_slowest_rank_ms_p50": slowest["package"] * 1e3,
    }


def main(argv) -> int:
    if argv and argv[0] == "--worker":
        worker(int(argv[1]), int(argv[2]), argv[3], int(argv[4]), int(argv[5]), argv[6])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--sources", default="20,200")
    ap.add_argument("--compiles", type=int, default=15)
    ap.add_argument("--states", default="differ,same",
                    help="differ: a third of the sources have a rank-dependent dim 0; "
                    "same: every rank sees the same shapes (our digest fast path)")
    ap.add_argument("--json", action="store_true", help="one JSON line per row")
    a = ap.parse_args(argv)
    rows = []
    for world in [int(x) for x in a.ranks.split(",")]:
        for sources, states in [(int(x), st) for x in a.sources.split(",")
                                for st in a.states.split(",")]:
            row = run_world(world, sources, a.compiles, states)
            rows.append(row)
            if a.json:
                print(json.dumps(row), flush=True)
    if not a.json:
        print(f"{'':20} {'compiler_collective step (p50)':^44} {'the exchange call alone (p50)':^44}")
        print(f"{'ranks':>5} {'sources':>7} {'states':>6} {'PyTorch':>12} {'package':>12} {'PyTorch/pkg':>12}"
              f" {'PyTorch':>12} {'package':>12} {'PyTorch/pkg':>12}")
        for r in rows:
            print(f"{r['ranks']:>5} {r['sources']:>7} {r['states']:>6} {r['pytorch_ms_p50']:>9.2f} ms "
                  f"{r['package_ms_p50']:>9.2f} ms {r['pytorch_over_package']:>11.2f}x"
                  f" {r['pytorch_exchange_call_ms_p50']:>9.2f} ms "
                  f"{r['package_exchange_call_ms_p50']:>9.2f} ms "
                  f"{r['exchange_call_pytorch_over_package']:>11.2f}x")
        print(f"({rows[0]['compiles']} compiles per exchange and row; a compile's time is the "
              "last rank to arrive's time in Dynamo's compiler_collective step: the exchange's "
              "own cost, without waiting for slower tracers)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
