"""The rank program of test_agreements.py's graph-check and partitioner cases.

CCOL_GRAPH_CASE:
- "rank_dependent": ``enable(check_graphs=True)``; rank 0's step adds where
  the others multiply. Event "raised": the error's type, groups and message,
  and the seconds it took.
- "uneven": ``enable(check_graphs=True)``; each rank's own parameter shard
  has its own static shape (rank r holds 3 - r rows, as FSDP2's uneven
  shards do) and the collective's input is the same shape everywhere; three
  steps. Event "done": the results.
- "partitioner_differs": ``_sync_decision_cross_ranks`` on, check_graphs
  off; the joint graphs differ between ranks (rank 0 takes the sine, the
  others the cosine, around a functional all_reduce). Event "done": the
  gradient and the package's log records.
- "spmd": Inductor's SPMD check on (with the reordering pass that makes
  Inductor run it, and ``cache_agreement=True``, which ``enable`` requires),
  ``spmd_mismatch`` from CCOL_SPMD_MISMATCH ("warn" or "error"), Inductor
  on CPU, each rank its own cold cache (TORCHINDUCTOR_CACHE_DIR, set by the
  test); rank 0's step adds where the others multiply, to the same values.
  Event "done" (the result, whether the report was logged) or "raised".
"""

from prelude import *

import logging

import torch._functorch.config as functorch_config
import torch.distributed._functional_collectives as funcol

import torch_comms

case = os.environ["CCOL_GRAPH_CASE"]
records = []


class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())


logging.getLogger("compiler_collectives.torch").addHandler(Keep())
logging.getLogger("compiler_collectives.torch").setLevel(logging.INFO)
timeout = float(os.environ.get("CCOL_GRAPH_TIMEOUT", "30"))


def run_rank_dependent(backend):
    """Rank 0's step adds where the others multiply (to the same values);
    emits "done" with the result, or "raised" with the error."""

    @torch.compile(backend=backend)
    def step(x):
        y = x + 1 if RANK == 0 else x * 2
        return funcol.all_reduce(y, "sum", dist.group.WORLD)

    started = time.monotonic()
    try:
        out = step(torch.ones(4))
        emit(ev="done", out=out.tolist(), torch_comms=torch_comms.calls,
             reported=any("SPMD GRAPH MISMATCH" in m for m in records),
             exchanges=cct.channel_info()["next_exchange"])
    except compiler_collectives.Error as e:
        emit(ev="raised", type=type(e).__name__, groups=getattr(e, "groups", None),
             message=str(e), seconds=time.monotonic() - started,
             torch_comms=torch_comms.calls, exchange=e.exchange, key=e.key,
             last_completed=e.last_completed)
    cct.disable()


if case == "rank_dependent":
    cct.enable(timeout=timeout, check_graphs=True)
    torch_comms.install()
    run_rank_dependent("aot_eager")

elif case == "uneven":
    cct.enable(timeout=timeout, check_graphs=True)
    torch_comms.install()

    @torch.compile(backend="aot_eager")
    def step(shard, x):
        local = (shard * 2).sum().reshape(1)
        return funcol.all_reduce(local + x.sum(), "sum", dist.group.WORLD)

    shard = torch.ones(3 - RANK, 4)
    out = [step(shard, torch.full((2,), float(s))).item() for s in range(3)]
    emit(ev="done", out=out, torch_comms=torch_comms.calls,
         exchanges=cct.channel_info()["next_exchange"])
    cct.disable()

elif case == "partitioner_differs":
    functorch_config._sync_decision_cross_ranks = True
    cct.enable(timeout=timeout)
    torch_comms.install()

    @torch.compile(backend="aot_eager_decomp_partition")
    def step(x):
        s = funcol.all_reduce(x.detach().sum().reshape(1), "sum", dist.group.WORLD)
        y = x.sin() if RANK == 0 else x.cos()
        return (y * s).sum()

    x = torch.ones(4, requires_grad=True)
    step(x).backward()
    emit(ev="done", grad=x.grad.tolist(), records=records, torch_comms=torch_comms.calls)
    cct.disable()

elif case == "spmd":
    import torch._inductor.config as inductor_config

    inductor_config.aten_distributed_optimizations.spmd_check = True
    inductor_config.aten_distributed_optimizations.spmd_mismatch = os.environ["CCOL_SPMD_MISMATCH"]
    inductor_config.reorder_for_compute_comm_overlap = True
    cct.enable(timeout=timeout, cache_agreement=True)
    torch_comms.install()
    run_rank_dependent("inductor")
