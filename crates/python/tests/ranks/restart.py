"""The rank program of test_restart.py: Dynamo's restart after a frame
exchange, skipped where it cannot change anything (enable's skip_restart).
CASE is a comma-separated list of cases; each runs twice in one job, with
skip_restart=True then False, each time from a clean slate (Dynamo's caches
and code state reset, the counters cleared, its own enable() and
disable()):

- "same_shapes": f(x, n) on a (8, 8) tensor and n=3 on both ranks (the
  default policy), then on a (5, 8) tensor: the first compile exchanged, the
  recompile local, on Dynamo's own automatic dynamic.
- "one_rank_differs": f on (8, 8) on rank 0 and (6, 8) on rank 1 at the
  first compile.
- "prior_on_one_rank": exchange="always"; rank 0 alone starts with a code
  state in which f's dim 0 is dynamic (as a PGO profile would give it), then
  both ranks call f on (8, 8).
- "graph_break": b(x), a frame with a graph break, on (8, 8) on both ranks,
  then on (4, 8) with exchange="always".
- "mark_dynamic": f on (8, 8) with dim 0 marked dynamic, on both ranks.

Events: "done" with the case, skip_restart, each compile's FX graph code,
after each step the guards of the frame's cache entries (ids masked) and
its code state (every field), the package's restart counters, Dynamo's
analysis attempts (InstructionTranslator runs) and the DEBUG lines of the
restart.
"""

import dataclasses
import importlib.util
import logging
import pathlib

from prelude import *

from torch._dynamo.utils import counters

harness_path = pathlib.Path(__file__).resolve().parents[4] / "tests/pytorch-oracle/harness.py"
spec = importlib.util.spec_from_file_location("ccol_oracle_harness", harness_path)
harness = importlib.util.module_from_spec(spec)
spec.loader.exec_module(harness)

CASES = os.environ["CASE"].split(",")
graphs = []


def backend(gm, example_inputs):
    graphs.append(gm.code)
    return gm.forward


def f(x, n):
    return (x * 2).sum() + torch.ones(n).sum()


def b(x):
    y = (x * 2).sum()
    torch._dynamo.graph_break()
    return y + x.mean()


def guards(fn):
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return [harness.mask_ids(str(e.guard_manager))
            for e in _debug_get_cache_entry_list(fn.__code__)]


def code_state(name):
    import torch._dynamo.pgo as pgo

    out = {}
    for code_id, state in (pgo._CODE_STATE or {}).items():
        if code_id.name == name:
            for source, entry in state.automatic_dynamic.items():
                out[source] = {fld.name: repr(getattr(entry, fld.name))
                               for fld in dataclasses.fields(entry)}
    return out


attempts = [0]
_run = torch._dynamo.symbolic_convert.InstructionTranslator.run


def counted_run(self):
    attempts[0] += 1
    return _run(self)


torch._dynamo.symbolic_convert.InstructionTranslator.run = counted_run


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        message = record.getMessage()
        if ": restart" in message:
            self.lines.append(message)


lines = Lines()
logger = logging.getLogger("compiler_collectives.torch")
logger.addHandler(lines)
logger.setLevel(logging.DEBUG)


def steps(fn, name, calls):
    out = []
    compiled = torch.compile(fn, backend=backend)
    for args in calls:
        compiled(*args)
        out.append({"guards": guards(fn), "code_state": code_state(name)})
    return out


def same_shapes():
    return steps(f, "f", [(torch.ones(8, 8), 3), (torch.ones(5, 8), 3)])


def one_rank_differs():
    return steps(f, "f", [(torch.ones(8 if RANK == 0 else 6, 8), 3)])


def prior_on_one_rank():
    if RANK == 0:
        import torch._dynamo.pgo as pgo

        entry = pgo.FrameStateSizeEntry.make_tensor((8, 8), (8, 1))
        entry |= pgo.FrameStateSizeEntry.make_tensor((5, 8), (8, 1))
        state = pgo.get_code_state()[pgo.CodeId.make(f.__code__, None)]
        state.automatic_dynamic["L['x']"] = entry
    return steps(f, "f", [(torch.ones(8, 8), 3)])


def mark_dynamic():
    x = torch.ones(8, 8)
    torch._dynamo.mark_dynamic(x, 0)
    return steps(f, "f", [(x, 3)])


def graph_break():
    return steps(b, "b", [(torch.ones(8, 8),), (torch.ones(4, 8),)])


#: Each case's enable() arguments besides skip_restart.
ARGS = {"prior_on_one_rank": {"exchange": "always"}, "graph_break": {"exchange": "always"}}

for case in CASES:
    for skip in (True, False):
        torch._dynamo.reset()
        counters.clear()
        graphs.clear()
        lines.lines.clear()
        attempts[0] = 0
        cct.enable(timeout=30, skip_restart=skip, **ARGS.get(case, {}))
        try:
            recorded = globals()[case]()
            emit(ev="done", case=case, skip=skip, graphs=list(graphs), steps=recorded,
                 restart_skipped=counters["compiler_collectives"]["restart_skipped"],
                 restarted=counters["compiler_collectives"]["restarted"],
                 attempts=attempts[0], lines=list(lines.lines),
                 exchanges=cct.channel_info()["next_exchange"])
        finally:
            cct.disable()
dist.destroy_process_group()
