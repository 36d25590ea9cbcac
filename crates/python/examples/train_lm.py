"""A small transformer language model trained with torch.compile + DDP on CPU
Gloo, each rank reading variable-length batches of a real text corpus, with
compiler_collectives deciding what every rank compiles.

Run it under torchrun (after the README's set-up, in the torch environment)::

    torchrun --standalone --nproc-per-node 2 crates/python/examples/train_lm.py

Every rank draws its own sequence lengths, so without an exchange each rank
decides static or dynamic on its own; with the package every rank compiles
the same graphs at the same steps. Options:

--exchange package|pytorch|none
    ``package`` (default): ``compiler_collectives.torch.enable()``;
    ``pytorch``: Dynamo's own compiler collectives
    (``torch._dynamo.config.enable_compiler_collectives``; on a CPU-only
    job PyTorch 2.13 needs a device patch, which this example does not
    apply: crates/python/tests/pytorch_patched.py runs it with the PyTorch
    oracle's); ``none``: no exchange.
--exchange-mode auto|always
    with the package: ``enable(exchange=...)`` (default ``auto``: a recompile
    on one rank alone stays there; ``always``: every compile is exchanged).
--backend aot_eager|inductor|eager   the torch.compile backend (aot_eager).
--steps N, --timeout S, --corpus DIR, --seed N
--graph-break-rank R --graph-break-step K
    rank R alone takes a graph break from step K: it recompiles while the
    others do not. With the package's default policy that recompile stays on
    rank R (the job runs, as without the package); with
    ``--exchange-mode always`` its exchange ends with a Timeout naming the
    others within the deadline (written to torchrun's error file); with
    Dynamo's own exchange it waits for the process group's timeout.
--short-last-batch-rank R
    rank R's last batch has 1 row where the others' have 4 (a dataset that
    does not divide evenly): rank R recompiles alone at the last step.
--eval-rank0-step K
    rank 0 alone evaluates the compiled model under ``no_grad`` (in
    ``eval()``) before step K: a recompile on rank 0 alone, which the
    package's default policy keeps there. --eval-in-local: inside
    ``compiler_collectives.torch.local()``, as a graph that holds
    collectives needs.
--skip-restart on|off
    with the package: ``enable(skip_restart=...)`` (default ``on``: Dynamo's
    restart after a frame exchange is skipped where it cannot change
    anything; ``off``: it always runs, as PyTorch's own path).
--check-graphs  with the package: ``enable(check_graphs=True)``, every rank checks
    that the others traced the same graph before it compiles one.
--report PATH   each rank writes its compile steps and losses to PATH.<rank>.json,
    with step 0's wall time, the time Dynamo spent compiling frames and the
    package's counters.
--log-steps     print a line as each step starts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import os
import random
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._dynamo.utils import compilation_time_metrics, counters
from torch.nn.parallel import DistributedDataParallel as DDP

CORPUS = "/usr/share/common-licenses"


def read_corpus(path: str) -> bytes:
    """Every regular file of the directory, in name order, as bytes."""
    files = sorted(p for p in Path(path).iterdir() if p.is_file() and not p.is_symlink())
    if not files:
        raise SystemExit(f"train_lm: no text files in {path}")
    return b"\n".join(p.read_bytes() for p in files)


class TinyLM(nn.Module):
    """Byte-level causal transformer: 256 tokens, 2 layers of width 64."""

    def __init__(self, width: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, width)
        self.position = nn.Embedding(512, width)
        layer = nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=2 * width, dropout=0.0, batch_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, 256)
        self.break_graph = False

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        positions = torch.arange(n, device=tokens.device)
        h = self.embed(tokens) + self.position(positions)
        if self.break_graph:
            torch._dynamo.graph_break()
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=tokens.device)
        h = self.blocks(h, mask=mask, is_causal=True)
        return self.head(h)


def batches(corpus: bytes, rank: int, steps: int, seed: int, batch: int = 4,
            last_batch: int | None = None):
    """Per-rank batches of (tokens, targets): lengths 16..96 drawn per rank
    and step (every rank its own), windows drawn from the corpus; the last
    one of `last_batch` rows when given."""
    rng = random.Random(seed * 1000 + rank)
    for step in range(steps):
        n = rng.randint(16, 96)
        rows = []
        for _ in range(last_batch if last_batch is not None and step == steps - 1 else batch):
            start = rng.randrange(0, len(corpus) - n - 1)
            rows.append(list(corpus[start : start + n + 1]))
        t = torch.tensor(rows, dtype=torch.long)
        yield t[:, :-1], t[:, 1:]


def stop_on_sigterm() -> None:
    """Once one rank fails, torchrun stops the others with SIGTERM, which
    would end this process at once, wherever it is. Raise SystemExit instead
    (once: a second SIGTERM is ignored), so that `finally` still writes this
    rank's report. A rank blocked in a collective gets there when the
    collective fails, as it does once its peer has exited."""
    raised = [False]

    def handler(signum, _frame):
        if not raised[0]:
            raised[0] = True
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def write_report(path: str, report: dict) -> None:
    """Writes `report` as JSON to `path` whole or not at all (a temporary
    file renamed over it)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(report, f)
    os.replace(tmp, path)


def common_args(ap: argparse.ArgumentParser) -> None:
    """The options every example of this directory takes (train_lm.py's)."""
    ap.add_argument("--backend", default="aot_eager")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=None)
    ap.add_argument("--corpus", default=CORPUS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--short-last-batch-rank", type=int, default=None)
    ap.add_argument("--report", default=None)


def counting_backend(name: str, compile_steps: list, step_now: list):
    """The backend `name`, appending ``step_now[0]`` to `compile_steps` at
    each compile."""
    from torch._dynamo.backends.registry import lookup_backend

    inner = lookup_backend(name)

    def backend(gm, example_inputs):
        compile_steps.append(step_now[0])
        return inner(gm, example_inputs)

    return backend


def evaluate(compiled, model, loss_fn, x, y, in_local: bool) -> float:
    """Rank 0's evaluation with the compiled model: ``eval()`` and
    ``no_grad``, which the other ranks do not run (inside
    ``compiler_collectives.torch.local()`` when `in_local`)."""
    import contextlib

    if in_local:
        import compiler_collectives.torch

        scope = compiler_collectives.torch.local()
    else:
        scope = contextlib.nullcontext()
    model.eval()
    try:
        with scope, torch.no_grad():
            logits = compiled(x)
            return loss_fn(logits.reshape(-1, 256), y.reshape(-1)).item()
    finally:
        model.train()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exchange", choices=["package", "pytorch", "none"], default="package")
    ap.add_argument("--exchange-mode", choices=["auto", "always"], default="auto")
    ap.add_argument("--eval-rank0-step", type=int, default=None)
    ap.add_argument("--eval-in-local", action="store_true")
    common_args(ap)
    ap.add_argument("--graph-break-rank", type=int, default=None)
    ap.add_argument("--graph-break-step", type=int, default=2)
    ap.add_argument("--check-graphs", action="store_true")
    ap.add_argument("--skip-restart", choices=["on", "off"], default="on")
    ap.add_argument("--log-steps", action="store_true", help="print a line as each step starts")
    a = ap.parse_args()

    torch.set_num_threads(1)
    # CPU only ("cpu:gloo": one device type, as Dynamo's own exchange asserts).
    dist.init_process_group("cpu:gloo", timeout=datetime.timedelta(minutes=30))
    rank = dist.get_rank()
    if a.exchange == "package":
        import compiler_collectives.torch

        compiler_collectives.torch.enable(timeout=a.timeout, check_graphs=a.check_graphs,
                                          exchange=a.exchange_mode,
                                          skip_restart=a.skip_restart == "on")
    elif a.exchange == "pytorch":
        torch._dynamo.config.enable_compiler_collectives = True

    torch.manual_seed(a.seed)
    model = TinyLM()
    ddp = DDP(model)
    # Kept until end()'s os._exit: freed at main's return, DDP's reducer
    # would free the process group, whose destructor joins Gloo's threads
    # while holding the GIL, and one of them may be waiting for the GIL to
    # free a finished work: a deadlock (torch 2.13.0, the job without the
    # package, once in CI).
    _KEPT.append(ddp)
    compile_steps: list[int] = []
    step_now = [0]
    compiled = torch.compile(ddp, backend=counting_backend(a.backend, compile_steps, step_now))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    losses: list[float] = []
    eval_losses: list[float] = []
    corpus = read_corpus(a.corpus)
    last_batch = 1 if a.short_last_batch_rank == rank else None
    started = time.monotonic()
    step_started = started
    first_step_end = None
    first_step_seconds = None
    stop_on_sigterm()
    try:
        for step, (x, y) in enumerate(batches(corpus, rank, a.steps, a.seed,
                                              last_batch=last_batch)):
            step_now[0] = step
            if a.eval_rank0_step == step and rank == 0:
                eval_losses.append(evaluate(compiled, model, loss_fn, x, y,
                                            a.exchange == "package" and a.eval_in_local))
            step_started = time.monotonic()
            if a.log_steps:
                print(f"train_lm: rank {rank} step {step}", flush=True)
            if a.graph_break_rank == rank and step >= a.graph_break_step:
                model.break_graph = True
            opt.zero_grad(set_to_none=True)
            logits = compiled(x)
            loss = loss_fn(logits.reshape(-1, 256), y.reshape(-1))
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if step == 0:
                first_step_end = time.time()
                first_step_seconds = time.monotonic() - step_started
    finally:
        if a.report:
            failed_after = time.monotonic() - step_started
            report = {
                "rank": rank,
                "compile_steps": compile_steps,
                "losses": [float.hex(v) for v in losses],
                "eval_losses": [float.hex(v) for v in eval_losses],
                "steps_done": len(losses),
                "seconds": time.monotonic() - started,
                "last_step_seconds": failed_after,
                # Wall-clock time (time.time()) at the end of step 0.
                "first_step_end": first_step_end,
                "first_step_seconds": first_step_seconds,
                # Dynamo's own timing of each frame compile (its
                # "_compile.compile_inner": tracing, the backend), summed.
                "frame_compile_seconds": sum(
                    compilation_time_metrics.get("_compile.compile_inner", [])),
                # The package's counters (local compiles, restarts skipped).
                "package_counters": dict(counters.get("compiler_collectives", {})),
            }
            try:
                write_report(f"{a.report}.{rank}.json", report)
            except SystemExit:
                # torchrun's SIGTERM landed in the write (the handler raises
                # once): write it again, then end as it asked.
                write_report(f"{a.report}.{rank}.json", report)
                raise
    if rank == 0:
        print(
            f"train_lm: {a.steps} steps, final loss {losses[-1]:.4f} "
            f"(perplexity {math.exp(losses[-1]):.1f}), compiles at steps {compile_steps}"
        )
    if a.exchange == "package":
        compiler_collectives.torch.disable()
    dist.destroy_process_group()
    return 0


#: What must outlive main() (see its use).
_KEPT: list = []


def end(code: int) -> None:
    """Ends the process with `code` once the job is done (every rank wrote
    its report; with the package the channel is shut down), without the
    interpreter's finalization and the C++ static destructors: there
    PyTorch 2.13 tears down its own threads (Gloo's workers and loop, joined
    when the GC frees the process group; the autograd engine's device
    threads, stopped in exit()), and on a loaded machine that teardown
    aborted a rank of the job without the package ("terminate called
    without an active exception", SIGABRT), after its report. An error
    before it still raises and exits as Python does."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    end(main())
