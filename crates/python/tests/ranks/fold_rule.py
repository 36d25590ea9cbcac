"""The rank program of test_ranks.py's fold-rule test (docs/python.md,
"Which states Dynamo folds"): each case compiles a function of its own on
two ranks, with PyTorch's own exchange (CCOL_MODE=pytorch, under the PyTorch
oracle's one CPU patch) or the package's (CCOL_MODE=package; with
CCOL_HIERARCHICAL_FROM=2, its tree exchange), and emits, after
each step, the frame's automatic-dynamic entries as Dynamo's fold left them
(see entries()), and each compile's symbolic inputs."""

from prelude import *

import importlib.util
import math
import pathlib

MODE = os.environ["CCOL_MODE"]
if MODE == "pytorch":
    path = pathlib.Path(__file__).resolve().parents[4] / "tests/pytorch-oracle/harness.py"
    spec = importlib.util.spec_from_file_location("ccol_oracle_harness", path)
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    harness._patch_compiler_collective_device_context()
    torch._dynamo.config.enable_compiler_collectives = True
else:
    cct.enable(timeout=60, exchange="always")  # every compile, as PyTorch's

from torch._dynamo.pgo import auto_dynamic, auto_unset, get_code_state  # noqa: E402


def mine(per_rank):
    return per_rank[RANK]


def marked(x, strict):
    """x with dim 0 marked dynamic (`strict`) or maybe dynamic."""
    (torch._dynamo.mark_dynamic if strict else torch._dynamo.maybe_mark_dynamic)(x, 0)
    return x


#: name -> (Dynamo settings, the function, each step's arguments on this rank,
#: or a function returning them)
CASES = {
    # 3 == 3.0 in Python: the fold keeps rank 0's 3; the join would be dynamic.
    "int_vs_float": ({}, lambda x, s: x * s, [(torch.ones(4), mine([3, 3.0]))]),
    # NaN != NaN: the fold makes it dynamic; the join would keep NaN.
    "nan": ({}, lambda x, s: x * s, [(torch.ones(4), math.nan)]),
    # 0.0 == -0.0: the fold keeps rank 0's 0.0; the join would be dynamic.
    "signed_zero": ({}, lambda x, s: x + s, [(torch.ones(4), mine([0.0, -0.0]))]),
    # A frame with both: x's sizes and s's differing floats join, t is per rank.
    "mixed_frame": ({}, lambda x, s, t: x * s + t, [
        (torch.ones(mine([4, 6]), 8), mine([2.5, 3.5]), mine([3, 3.0])),
        (torch.ones(mine([5, 7]), 8), 2.5, mine([3.0, 3])),
    ]),
    # Automatic dynamic shapes off: the fold overwrites, the last rank wins.
    "automatic_dynamic_off": ({"automatic_dynamic_shapes": False}, lambda x: x * 2, [
        (torch.ones(mine([4, 6])),),
        (torch.ones(mine([5, 5])),),
    ]),
    # Both off and on, one rank marking dim 0 dynamic (which records
    # excluded sizes in the entry it sends), the other maybe-dynamic: the
    # last rank's entry becomes every rank's, excluded sizes included.
    "marked_entry_overwrites": (
        {"automatic_dynamic_shapes": False, "automatic_dynamic_exclusion_guard": True},
        lambda x: x * 2,
        [lambda: (marked(torch.ones(4, 8), RANK == 1),)],
    ),
    # The exclusion guard on: the fold's excluded_sizes depend on how many
    # states it folds (a second equal one clears them).
    "exclusion_guard": ({"automatic_dynamic_exclusion_guard": True}, lambda x: x * 2, [
        (torch.ones(5, 8),),
        (torch.ones(6, 8),),
        (torch.ones(mine([7, 9]), 8),),
    ]),
}

compiles = []


def backend(gm, example_inputs):
    from torch.fx.experimental.symbolic_shapes import free_symbols

    symbolic = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        v = node.meta.get("example_value")
        if isinstance(v, torch.Tensor):
            symbolic += [f"{node.name}.{i}" for i, d in enumerate(v.size()) if free_symbols(d)]
        elif isinstance(v, (torch.SymInt, torch.SymFloat)):
            symbolic.append(node.name)
    compiles.append(symbolic)
    return gm.forward


def show(v):
    if v is auto_dynamic:
        return "dyn"
    if v is auto_unset:
        return "unset"
    if isinstance(v, tuple):
        return "(" + ", ".join(show(x) for x in v) + ")"
    return repr(v)


def entries(fn, excluded):
    """The frame's entries; with `excluded`, their excluded_sizes and
    excluded_scalar too (Dynamo reads those only with the exclusion guard
    on, and only there is the package bound to keep them as PyTorch's)."""
    (state,) = [s for k, s in get_code_state().items() if k.firstlineno == fn.__code__.co_firstlineno]
    return {
        name: [show(e.scalar), show(e.size), show(e.stride)]
        + ([repr(e.excluded_sizes), repr(e.excluded_scalar)] if excluded else [])
        for name, e in sorted(state.automatic_dynamic.items())
    }


for case, (settings, fn, steps) in CASES.items():
    if not all(hasattr(torch._dynamo.config, k) for k in settings):
        continue  # a setting this torch does not have (the exclusion guard: 2.12 on)
    compiles.clear()
    after = []
    with torch._dynamo.config.patch(**settings):
        compiled = torch.compile(fn, backend=backend)
        for args in steps:
            compiled(*(args() if callable(args) else args))
            after.append(entries(fn, settings.get("automatic_dynamic_exclusion_guard", False)))
    emit(ev="case", case=case, steps=after, compiles=list(compiles))
    torch._dynamo.reset()
info = cct.channel_info()
emit(ev="done", topology=info and info["topology"], next=info and info["next_exchange"])
