"""The rank program of test_policy.py: the agreement policy (enable's
exchange= and guard_votes=, and local()). CASE is a comma-separated list of
cases, run in turn in one job, each from a clean slate (Dynamo's caches and
code state reset, the counters cleared, its own enable() and disable()):

- "shorter_last_batch": f of steps.py, rank 0's last batch shorter
  (8, 8, 8, 5), rank 1's not; the default policy.
- "rank0_eval": f on both ranks, then rank 0 alone calls it under no_grad
  (an evaluation), then both go on.
- "funcol_shorter": g, whose graph all-reduces with a functional
  collective, rank 0's last batch shorter; the default policy (guard votes
  turn on at g's first compile).
- "local_then_shape_change": g; rank 0 calls it on a shorter batch and h
  for the first time inside local() (rank 1 issues the matching all-reduce
  eagerly), then both ranks call g on a new shape together.
- "prior_join": rank 0 recompiles f alone (dim 0 dynamic in its code state,
  not in rank 1's); then g's first compile turns votes on, and both ranks
  call f on a new dim 1: the exchanged recompile folds the same state on
  both (each sent its prior entry joined with its observation).
- "recompile_limit": recompile_limit 3; rank 0 recompiles f alone twice (3
  cache entries: over Dynamo's own limit for its next compile); then votes
  turn on (g), and both call f in float64: the exchanged recompile is the
  second exchanged compile of f on both ranks, under the limit on both.
- "compiled_ddp": DDP compiled with compiled autograd and the Python
  reducer (the all-reduces traced into the backward graph), rank 0's last
  batch shorter.
- "first_compile_in_local": rank 0 alone calls h, compiled but never
  called on rank 1, inside local() (it runs; outside local(), notice.py).
- "reset_then_shapes_differ": f on the same shapes, then
  torch.compiler.reset() while enabled, then f on batches of 8 rows on rank
  0 and 6 on rank 1.

Events: "done" (with the case's name) with each rank's compiles (steps.py's
backend), exchanges (the channel's next exchange number), the local-compile
counter, whether votes are on, and the code state Dynamo keeps for g.
"""

from prelude import *
from steps import *

import torch.distributed._functional_collectives as funcol
from torch._dynamo.utils import counters

CASES = os.environ["CASE"].split(",")
timeout = float(os.environ.get("CCOL_POLICY_TIMEOUT", "30"))


@torch.compile(backend=backend)
def g(x):
    # The reduced tensor has the same shape on every rank (8,).
    return funcol.all_reduce((x * 2).sum(0), "sum", dist.group.WORLD).sum()


@torch.compile(backend=backend)
def h(x):
    return (x + 1).sum()


def code_state(name):
    import torch._dynamo.pgo as pgo

    out = {}
    for code_id, state in (pgo._CODE_STATE or {}).items():
        if code_id.name == name:
            out.update({k: v.render() for k, v in state.automatic_dynamic.items()})
    return out


def done(case, **kv):
    info = cct.channel_info()
    emit(ev="done", case=case, compiles=list(compiles), exchanges=info["next_exchange"],
         local_compiles=counters["compiler_collectives"]["local_compile"],
         votes_on=info["votes_on"], code_state_g=code_state("g"), **kv)


def shorter_last_batch():
    run([8, 8, 8, 5] if RANK == 0 else [8, 8, 8, 8])
    return {}


def rank0_eval():
    run([8, 8])
    if RANK == 0:
        with torch.no_grad():
            f(torch.ones(8, 8))
    run([8, 8])
    return {}


def funcol_shorter():
    return {"results": [float(g(torch.ones(n, 8))) for n in ([8, 8, 5] if RANK == 0 else [8, 8, 8])]}


def local_then_shape_change():
    results = [float(g(torch.ones(8, 8)))]
    if RANK == 0:
        with cct.local():
            results.append(float(g(torch.ones(5, 8))))  # a recompile, local, no vote
            results.append(float(h(torch.ones(3, 8))))  # a first compile, local
        emit(ev="local", compiles=list(compiles), code_state_g=code_state("g"))
    else:
        # The all-reduce of rank 0's g inside local().
        results.append(float(funcol.all_reduce(torch.full((8,), 10.0), "sum",
                                               dist.group.WORLD).sum()))
    results.append(float(g(torch.ones(6, 8))))
    return {"results": results}


def prior_join():
    f(torch.ones(8, 8))
    f(torch.ones(5 if RANK == 0 else 8, 8))  # rank 0: a local recompile, dim 0 dynamic
    g(torch.ones(8, 8))  # holds an all-reduce: votes on from here
    f(torch.ones(8, 9))  # both miss: one exchanged recompile
    return {"code_state_f": code_state("f")}


def recompile_limit():
    f(torch.ones(8, 8))
    if RANK == 0:
        f(torch.ones(5, 8))  # local: dim 0 dynamic
        f(torch.ones(5, 9))  # local: dim 1 dynamic; 3 entries
    g(torch.ones(8, 8))
    return {"results": [float(f(torch.ones(8, 8, dtype=torch.float64)))]}


def compiled_ddp():
    from torch._dynamo import compiled_autograd
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(DDP(model), backend=backend)
    losses = []
    for n in ([4, 4, 4, 2] if RANK == 0 else [4, 4, 4, 4]):
        opt.zero_grad()
        x = torch.arange(n * 8, dtype=torch.float32).reshape(n, 8) / 100 + RANK
        with compiled_autograd._enable(torch.compile(backend=backend)):
            loss = compiled(x).pow(2).mean()
            loss.backward()
        opt.step()
        losses.append(float(loss))
    digest = float(sum(p.detach().double().sum() for p in model.parameters()))
    return {"losses": losses, "params": digest}


def first_compile_in_local():
    f(torch.ones(4, 8))
    if RANK == 0:
        with cct.local():
            h(torch.ones(4, 8))  # a first compile on rank 0 alone
    return {"error": None}


def reset_then_shapes_differ():
    run([8])
    torch.compiler.reset()
    run([8] if RANK == 0 else [6])
    return {}


#: Settings a case needs on every rank before enable's check, and their
#: values to put back after it.
SETTINGS = {
    "recompile_limit": {"recompile_limit": 3},
    # Compiled DDP: compiled autograd captures each backward, DDP's
    # all-reduces in it.
    "compiled_ddp": {"optimize_ddp": "python_reducer"},
}

for case in CASES:
    settings = SETTINGS.get(case, {})
    before = {k: getattr(torch._dynamo.config, k) for k in settings}
    for k, v in settings.items():
        setattr(torch._dynamo.config, k, v)
    # Each case from a clean slate: Dynamo's caches and code state, the
    # counters, the compiles list; its own enable().
    torch._dynamo.reset()
    counters.clear()
    compiles.clear()
    cct.enable(timeout=timeout)
    out = globals()[case]()
    if out is not None:
        done(case, **out)
    cct.disable()
    for k, v in before.items():
        setattr(torch._dynamo.config, k, v)
