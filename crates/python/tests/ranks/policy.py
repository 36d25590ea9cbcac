"""The rank program of test_policy.py: the agreement policy (enable's
exchange= and guard_votes=, and local()). CASE chooses:

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
- "first_compile_alone": rank 0 alone calls h, compiled but never called on
  rank 1 (outside local(): a Timeout naming rank 1); with LOCAL=1 inside
  local() (it runs).

Events: "done" with each rank's compiles (steps.py's backend), exchanges
(the channel's next exchange number), the local-compile counter, whether
votes are on, and the code state Dynamo keeps for g; or with the error.
"""

from prelude import *
from steps import *

import torch.distributed._functional_collectives as funcol
from torch._dynamo.utils import counters

CASE = os.environ["CASE"]
timeout = float(os.environ.get("CCOL_POLICY_TIMEOUT", "30"))
cct.enable(timeout=timeout)


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


def done(**kv):
    info = cct.channel_info()
    emit(ev="done", compiles=compiles, exchanges=info["next_exchange"],
         local_compiles=counters["compiler_collectives"]["local_compile"],
         votes_on=info["votes_on"], code_state_g=code_state("g"), **kv)


if CASE == "shorter_last_batch":
    run([8, 8, 8, 5] if RANK == 0 else [8, 8, 8, 8])
    done()
elif CASE == "rank0_eval":
    run([8, 8])
    if RANK == 0:
        with torch.no_grad():
            f(torch.ones(8, 8))
    run([8, 8])
    done()
elif CASE == "funcol_shorter":
    results = [float(g(torch.ones(n, 8))) for n in ([8, 8, 5] if RANK == 0 else [8, 8, 8])]
    done(results=results)
elif CASE == "local_then_shape_change":
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
    done(results=results)
elif CASE == "first_compile_alone":
    f(torch.ones(4, 8))
    if RANK == 1:
        time.sleep(timeout + 3)
        done()
    else:
        start = time.monotonic()
        try:
            if os.environ.get("LOCAL") == "1":
                with cct.local():
                    h(torch.ones(4, 8))
            else:
                h(torch.ones(4, 8))
            done(error=None)
        except compiler_collectives.Error as e:
            emit(ev="error", kind=e.kind, missing=e.missing_ranks, exchange=e.exchange, key=e.key,
                 message=str(e), waited=time.monotonic() - start)
else:
    raise SystemExit(f"unknown CASE {CASE}")
