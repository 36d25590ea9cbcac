#!/usr/bin/env python3
"""The time Dynamo spends in its ``compiler_collective`` step, and in folding
what the step returned: PyTorch's own exchange against the
compiler_collectives package, in one run.

Usage (in the torch environment, after ``scripts/setup-python.sh``)::

    "$CCOL_TORCH_PYTHON" bench/torch_compiler_collective.py [--ranks 2,4]
        [--sources 20,200] [--compiles N] [--states differ,same] [--json]
    "$CCOL_TORCH_PYTHON" bench/torch_compiler_collective.py --from run.jsonl [--markdown]

``--compiles`` defaults to 15, or 3 for 1000 sources and more (a
2000-argument compile takes about 15 s on a 2-core machine):
``--sources 2000 --compiles 3``.

For each world size it starts that many rank processes (CPU Gloo over a
FileStore, ``cpu:gloo``), and each rank compiles, ``--compiles`` times per
exchange, a fresh function of ``--sources`` tensor arguments, a third of
them with a rank-dependent dim 0 (so the ranks' states differ and the full
exchange runs; ``--states same``: every rank the same shapes, where the
package's digest round suffices) — alternating PyTorch's exchange and the
package's, compile by compile, so that noise hits both alike. Both sides are
measured the same way, by the same code:

- **step**: Dynamo times it itself (``dynamo_timed("compiler_collective")``,
  read from ``torch._dynamo.utils.compilation_time_metrics``): for PyTorch,
  the ``all_gather_object`` of the ``LocalState`` (pickling included) under
  the PyTorch oracle's one CPU patch (tests/pytorch-oracle/README.md); for
  the package, its exchange (conversion included).
- **exchange call**: the ``all_gather_object`` call alone (PyTorch) or
  ``exchange_local_state`` alone (package), inside the step.
- **fold**: the time of every ``process_automatic_dynamic`` call that Dynamo
  makes in that compile once the step has set ``all_states`` (the restarted
  trace, where each source's entry is folded over ``all_states``: PyTorch's
  path runs ``update_automatic_dynamic`` once per rank that has the source).
  The calls are timed where Dynamo makes them (``torch._dynamo.variables.
  builder``'s global, and ``pgo``'s), wrapping whatever is installed there
  for that compile, outermost call only.
- **step + fold**: a rank's step plus its fold, in that compile.
- **compile wall**: the whole ``torch.compile(f)(*inputs)`` call (both
  traces, the step, the fold, the backend), ranks started by a barrier.

Which rank a compile's figure is: the step, the exchange call and step +
fold are those of the last rank to arrive at the step — the rank whose step
is shortest: the others also wait there for it to finish tracing, so its step
is the exchange's own cost (the slowest rank's step, max over ranks, is in
the JSON). Compile wall is the max over ranks (the compile is over when every
rank's is).

Each row gives the medians over compiles of both sides and their ratio
(PyTorch / package, "ratio of medians"), and, since the sides alternate, the
ratio of the two sides paired compile by compile (compile k of PyTorch over
compile k of the package) and the median of those per-compile ratios. The
text output lists the per-compile ratios under the table; ``--json`` prints
one line per row with every median, every per-compile figure and ratio, and
each rank's raw values (seconds), so that docs can be generated from it;
``--from FILE`` prints the table of such a file.
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
MODES = ("pytorch", "package")


def patch_pytorch_exchange() -> None:
    spec = importlib.util.spec_from_file_location(
        "ccol_oracle_harness", ROOT / "tests/pytorch-oracle/harness.py"
    )
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    harness._patch_compiler_collective_device_context()


class FoldTimer:
    """Times ``process_automatic_dynamic`` where Dynamo calls it, after the
    compiler collective (``all_states`` set): the fold of every rank's state.

    ``install`` wraps whatever each module holds at that moment (so a
    replacement installed by ``enable()`` is timed too) and ``uninstall``
    puts it back; nested calls count once."""

    def __init__(self, modules):
        import time

        self.clock = time.perf_counter
        self.modules = modules
        self.saved = []
        self.seconds = 0.0
        self.calls = 0
        self.depth = 0

    def reset(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def install(self) -> None:
        if self.saved:
            raise AssertionError("fold timer installed twice")
        for module in self.modules:
            inner = module.process_automatic_dynamic
            self.saved.append((module, inner))
            module.process_automatic_dynamic = self._wrap(inner)

    def uninstall(self) -> None:
        while self.saved:
            module, inner = self.saved.pop()
            module.process_automatic_dynamic = inner

    def _wrap(self, inner):
        timer = self

        def process_automatic_dynamic(tx, *args, **kwargs):
            ds = getattr(tx, "distributed_state", None)
            if timer.depth or ds is None or ds.all_states is None:
                return inner(tx, *args, **kwargs)
            timer.depth += 1
            start = timer.clock()
            try:
                return inner(tx, *args, **kwargs)
            finally:
                timer.seconds += timer.clock() - start
                timer.calls += 1
                timer.depth -= 1

        process_automatic_dynamic.__wrapped__ = inner
        return process_automatic_dynamic


def join_job(rank: int, world: int, store: str):
    """A rank's start: torch's CPU Gloo group over the FileStore `store`;
    returns ``OutputGraph.run_compiler_collective`` unpatched and patched.
    PyTorch's exchange runs patched; the package checks (and replaces) the
    unpatched method, so each mode gets its own."""
    import datetime

    import torch.distributed as dist
    import torch._dynamo.output_graph as og

    original = og.OutputGraph.__dict__["run_compiler_collective"]
    patch_pytorch_exchange()
    patched = og.OutputGraph.__dict__["run_compiler_collective"]
    dist.init_process_group("cpu:gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(minutes=10))
    return original, patched


def use_exchange(mode: str, original, patched, skip_restart: bool = False) -> None:
    """Before one compile: ``package`` enables the package on the unpatched
    method (a deadline that covers waiting for the slowest tracer: 2000
    sources on 4 ranks of a 2-core machine trace for a minute), every
    compile exchanged and, unless `skip_restart`, Dynamo's restart after
    each exchange kept, as on PyTorch's path (this bench's fold is timed in
    the restarted trace); ``pytorch`` turns PyTorch's patched exchange on,
    ``off`` neither."""
    import torch
    import torch._dynamo.output_graph as og

    import compiler_collectives.torch as cct

    torch._dynamo.reset()
    if mode == "package":
        og.OutputGraph.run_compiler_collective = original
        cct.enable(timeout=600, exchange="always", skip_restart=skip_restart)
    elif mode == "pytorch":
        og.OutputGraph.run_compiler_collective = patched
        torch._dynamo.config.enable_compiler_collectives = True


def emit_rows(rows, as_json: bool, print_rows) -> int:
    """A bench's output: one JSON line per row (``--json``), else
    ``print_rows(rows)``; returns the exit status, 0."""
    if as_json:
        for r in rows:
            print(json.dumps(r))
    else:
        print_rows(rows)
    return 0


def run_ranks(script: str, world: int, args: list) -> list:
    """Runs `script` ``--worker RANK WORLD STORE *args`` in `world`
    processes and returns each rank's last stdout line, parsed as JSON."""
    with tempfile.TemporaryDirectory(prefix="ccol-bench-") as d:
        env = dict(os.environ)
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env["OMP_NUM_THREADS"] = "1"
        procs = [
            subprocess.Popen(
                [sys.executable, script, "--worker", str(r), str(world), f"{d}/store",
                 *[str(a) for a in args]],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            )
            for r in range(world)
        ]
        ranks = []
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=3600)
            if p.returncode != 0:
                raise SystemExit(f"rank {r} failed (exit {p.returncode}):\n{err[-4000:]}")
            ranks.append(json.loads(out.strip().splitlines()[-1]))
    return ranks


def worker(rank: int, world: int, store: str, sources: int, compiles: int, states: str) -> None:
    import time

    import torch
    import torch.distributed as dist

    import torch._dynamo.pgo as pgo
    import torch._dynamo.variables.builder as builder

    original, patched = join_job(rank, world, store)
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

    from torch._dynamo import distributed as dd

    real_gather = dist.all_gather_object

    def timed_gather(object_list, obj, group=None):
        start = time.perf_counter()
        out = real_gather(object_list, obj, group=group)
        if group is not None and group is dd._COMPILE_PG:
            calls.append(time.perf_counter() - start)
        return out

    dist.all_gather_object = timed_gather

    class TimedChannel:
        def __init__(self, channel):
            self.channel = channel

        def exchange_local_state(self, *args):
            start = time.perf_counter()
            out = self.channel.exchange_local_state(*args)
            calls.append(time.perf_counter() - start)
            return out

        def __getattr__(self, name):
            return getattr(self.channel, name)

    # Dynamo calls process_automatic_dynamic through builder's global (it
    # imports the name); pgo's is wrapped too, for a caller that looks it up
    # there. Nested calls (one wrapping the other) count once.
    fold = FoldTimer([builder, pgo])
    raw = {m: {"step": [], "exchange": [], "fold": [], "fold_calls": [], "wall": []}
           for m in MODES}
    for k in range(compiles):
        for mode in MODES:
            use_exchange(mode, original, patched)
            if mode == "package":
                cct._state.current.channel = TimedChannel(cct._state.current.channel)
            scope = {}
            code = f"def f({', '.join(names)}):\n    out = 0\n{body}\n    return out\n"
            exec(compile(code, f"<bench-{mode}-{k}>", "exec"), scope)  # noqa: S102
            compiled = torch.compile(scope["f"], backend=backend)
            compilation_time_metrics.pop("compiler_collective", None)
            calls.clear()
            fold.reset()
            fold.install()
            try:
                dist.barrier()
                start = time.perf_counter()
                compiled(*inputs)
                wall = time.perf_counter() - start
            finally:
                fold.uninstall()
            got = compilation_time_metrics.get("compiler_collective", [])
            if len(got) != 1:
                raise SystemExit(f"rank {rank}: expected one compiler_collective step, saw {got}")
            if fold.calls == 0:
                raise SystemExit(f"rank {rank}: no process_automatic_dynamic call after the step")
            r = raw[mode]
            r["step"].append(got[0])
            r["exchange"].append(calls[0] if len(calls) == 1 else float("nan"))
            r["fold"].append(fold.seconds)
            r["fold_calls"].append(fold.calls)
            r["wall"].append(wall)
            if mode == "package":
                cct.disable()
            torch._dynamo.config.enable_compiler_collectives = False
    print(json.dumps({"rank": rank, "torch": torch.__version__, "raw": raw}), flush=True)
    dist.destroy_process_group()


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def summarize(world: int, sources: int, compiles: int, states: str, ranks: list) -> dict:
    """One row from every rank's raw values (``ranks[r]["raw"][mode][what][k]``,
    seconds)."""
    p50 = statistics.median

    def across(mode, what, k):
        return [r["raw"][mode][what][k] for r in ranks]

    # Per compile and side: the last rank to arrive at the step (shortest
    # step) gives the step, the exchange call and step + fold; wall is the
    # max over ranks.
    per = {m: {"step": [], "exchange": [], "fold": [], "step_fold": [], "wall": [],
               "slowest_step": [], "last_rank": []} for m in MODES}
    for m in MODES:
        for k in range(compiles):
            steps = across(m, "step", k)
            last = min(range(len(ranks)), key=lambda i: steps[i])
            raw = ranks[last]["raw"][m]
            per[m]["last_rank"].append(last)
            per[m]["step"].append(steps[last])
            per[m]["slowest_step"].append(max(steps))
            per[m]["exchange"].append(min(across(m, "exchange", k)))
            per[m]["fold"].append(raw["fold"][k])
            per[m]["step_fold"].append(raw["step"][k] + raw["fold"][k])
            per[m]["wall"].append(max(across(m, "wall", k)))

    def ratios(what):
        return [_ratio(p, q) for p, q in zip(per["pytorch"][what], per["package"][what])]

    med = {m: {what: p50(v) for what, v in per[m].items() if what != "last_rank"} for m in MODES}
    row = {
        "ranks": world,
        "sources": sources,
        "states": states,
        "compiles": compiles,
        "torch": ranks[0].get("torch"),
    }
    # The step: the columns as before (ratio of medians) and the median of
    # the per-compile ratios.
    row.update({
        "pytorch_ms_p50": med["pytorch"]["step"] * 1e3,
        "package_ms_p50": med["package"]["step"] * 1e3,
        "pytorch_over_package": _ratio(med["pytorch"]["step"], med["package"]["step"]),
        "pytorch_over_package_per_compile_p50": p50(ratios("step")),
        "pytorch_exchange_call_ms_p50": med["pytorch"]["exchange"] * 1e3,
        "package_exchange_call_ms_p50": med["package"]["exchange"] * 1e3,
        "exchange_call_pytorch_over_package":
            _ratio(med["pytorch"]["exchange"], med["package"]["exchange"]),
        "exchange_call_pytorch_over_package_per_compile_p50": p50(ratios("exchange")),
        "pytorch_slowest_rank_ms_p50": med["pytorch"]["slowest_step"] * 1e3,
        "package_slowest_rank_ms_p50": med["package"]["slowest_step"] * 1e3,
        # Dynamo's fold, and the step plus the fold.
        "pytorch_fold_ms_p50": med["pytorch"]["fold"] * 1e3,
        "package_fold_ms_p50": med["package"]["fold"] * 1e3,
        "pytorch_step_fold_ms_p50": med["pytorch"]["step_fold"] * 1e3,
        "package_step_fold_ms_p50": med["package"]["step_fold"] * 1e3,
        "step_fold_pytorch_over_package":
            _ratio(med["pytorch"]["step_fold"], med["package"]["step_fold"]),
        "step_fold_pytorch_over_package_per_compile_p50": p50(ratios("step_fold")),
        # The whole compile.
        "pytorch_compile_wall_ms_p50": med["pytorch"]["wall"] * 1e3,
        "package_compile_wall_ms_p50": med["package"]["wall"] * 1e3,
        "compile_wall_pytorch_over_package":
            _ratio(med["pytorch"]["wall"], med["package"]["wall"]),
        "compile_wall_pytorch_over_package_per_compile_p50": p50(ratios("wall")),
    })
    # Compile by compile: each side's figure (ms), and the paired ratios.
    row["per_compile"] = {
        **{f"{m}_{what}_ms": [v * 1e3 for v in per[m][what]]
           for m in MODES for what in ("step", "exchange", "fold", "step_fold", "wall")},
        **{f"{m}_last_rank": per[m]["last_rank"] for m in MODES},
        "step_ratio": ratios("step"),
        "exchange_call_ratio": ratios("exchange"),
        "step_fold_ratio": ratios("step_fold"),
        "compile_wall_ratio": ratios("wall"),
    }
    # Every rank's raw values, seconds: raw[mode][what][rank][compile].
    row["raw_s"] = {
        m: {what: [r["raw"][m][what] for r in ranks]
            for what in ("step", "exchange", "fold", "fold_calls", "wall")}
        for m in MODES
    }
    return row


def run_world(world: int, sources: int, compiles: int, states: str) -> dict:
    ranks = run_ranks(__file__, world, [sources, compiles, states])
    return summarize(world, sources, compiles, states, ranks)


def print_markdown(rows) -> None:
    """The rows as one Markdown table (docs/performance.md): medians in ms,
    the ratio of medians and the median of the per-compile ratios."""
    print("| ranks | sources | states | step: PyTorch | package | p50 ratio | ratio of p50s "
          "| step + fold: PyTorch | package | p50 ratio | fold: PyTorch | package "
          "| compile wall: PyTorch | package |")
    print("|" + "---:|" * 14)
    for r in rows:
        print(f"| {r['ranks']} | {r['sources']} | {r['states']}"
              f" | {r['pytorch_ms_p50']:.2f} | {r['package_ms_p50']:.2f}"
              f" | **{r['pytorch_over_package_per_compile_p50']:.2f}×**"
              f" | {r['pytorch_over_package']:.2f}×"
              f" | {r['pytorch_step_fold_ms_p50']:.2f} | {r['package_step_fold_ms_p50']:.2f}"
              f" | **{r['step_fold_pytorch_over_package_per_compile_p50']:.2f}×**"
              f" | {r['pytorch_fold_ms_p50']:.2f} | {r['package_fold_ms_p50']:.2f}"
              f" | {r['pytorch_compile_wall_ms_p50']:.0f} | {r['package_compile_wall_ms_p50']:.0f} |")


def print_table(rows) -> None:
    step = "compiler_collective step (p50)"
    call = "exchange call alone (p50)"
    sf = "step + Dynamo's fold (p50)"
    wall = "compile wall (p50)"
    print(f"{'':20} {step:^56} {call:^38} {sf:^44} {wall:^26}")
    print(f"{'ranks':>5} {'sources':>7} {'states':>6}"
          f" {'PyTorch':>12} {'package':>12} {'ratio p50s':>14} {'p50 ratio':>14}"
          f" {'PyTorch':>12} {'package':>12} {'ratio p50s':>12}"
          f" {'PyTorch':>12} {'package':>12} {'p50 ratio':>14}"
          f" {'PyTorch':>12} {'package':>12}")
    for r in rows:
        print(f"{r['ranks']:>5} {r['sources']:>7} {r['states']:>6}"
              f" {r['pytorch_ms_p50']:>9.2f} ms {r['package_ms_p50']:>9.2f} ms"
              f" {r['pytorch_over_package']:>13.2f}x"
              f" {r['pytorch_over_package_per_compile_p50']:>13.2f}x"
              f" {r['pytorch_exchange_call_ms_p50']:>9.2f} ms"
              f" {r['package_exchange_call_ms_p50']:>9.2f} ms"
              f" {r['exchange_call_pytorch_over_package']:>11.2f}x"
              f" {r['pytorch_step_fold_ms_p50']:>9.2f} ms {r['package_step_fold_ms_p50']:>9.2f} ms"
              f" {r['step_fold_pytorch_over_package_per_compile_p50']:>13.2f}x"
              f" {r['pytorch_compile_wall_ms_p50']:>9.1f} ms"
              f" {r['package_compile_wall_ms_p50']:>9.1f} ms")
    print()
    print("per-compile ratios PyTorch / package (compile 1, 2, ...):")
    for r in rows:
        pc = r["per_compile"]
        print(f"{r['ranks']:>5} {r['sources']:>7} {r['states']:>6}"
              f"  step: {' '.join(f'{x:.2f}' for x in pc['step_ratio'])}")
        print(f"{'':20}  step + fold: {' '.join(f'{x:.2f}' for x in pc['step_fold_ratio'])}")
    print()
    print(f"({', '.join(sorted({str(r['compiles']) for r in rows}))} compiles per exchange and "
          f"row, torch {rows[0]['torch']}; step, exchange call and step + fold: the last rank "
          "to arrive at the step (its shortest step: the exchange's own cost, without waiting "
          "for slower tracers); fold: Dynamo's process_automatic_dynamic calls after the step; "
          "compile wall: the whole torch.compile call, max over ranks; 'ratio p50s': PyTorch's "
          "median over the package's; 'p50 ratio': the median of the per-compile ratios, the "
          "two sides paired compile by compile)")


def main(argv) -> int:
    if argv and argv[0] == "--worker":
        worker(int(argv[1]), int(argv[2]), argv[3], int(argv[4]), int(argv[5]), argv[6])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--sources", default="20,200")
    ap.add_argument("--compiles", type=int, default=None,
                    help="compiles per exchange and row (default: 15; 3 for 1000 sources "
                    "and more)")
    ap.add_argument("--states", default="differ,same",
                    help="differ: a third of the sources have a rank-dependent dim 0; "
                    "same: every rank sees the same shapes (our digest fast path)")
    ap.add_argument("--json", action="store_true", help="one JSON line per row")
    ap.add_argument("--from", dest="from_", metavar="FILE",
                    help="run nothing: print the table of a --json run's output")
    ap.add_argument("--markdown", action="store_true",
                    help="with --from: the table as Markdown (docs/performance.md)")
    a = ap.parse_args(argv)
    if a.from_:
        text = pathlib.Path(a.from_).read_text()
        rows = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        (print_markdown if a.markdown else print_table)(rows)
        return 0
    if a.markdown:
        ap.error("--markdown goes with --from")
    if a.compiles is not None and a.compiles < 1:
        ap.error("--compiles must be at least 1")
    rows = []
    for world in [int(x) for x in a.ranks.split(",")]:
        for sources, states in [(int(x), st) for x in a.sources.split(",")
                                for st in a.states.split(",")]:
            compiles = a.compiles if a.compiles is not None else (3 if sources >= 1000 else 15)
            row = run_world(world, sources, compiles, states)
            rows.append(row)
            if a.json:
                print(json.dumps(row), flush=True)
    if not a.json:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
