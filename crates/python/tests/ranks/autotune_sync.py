"""The rank program of test_agreements.py's autotuning cases: Inductor's
``distributed_autotune._sync`` (replaced by the package) driven directly
with what Inductor passes it — this rank's ``_SerializedChoice`` winners of
the ops it owns (op k is owned by rank k % 2) — under a per-graph autotune
state holding the op list the package's wrapper of
``maybe_autotune_remote`` records. On CPU the real path never runs (it needs
several GEMM choices, which CPU templates do not serialize).

CCOL_AUTOTUNE_CASE: "equal" (the same op list on every rank), "differ"
(rank 1 saw a different layout for op 2) or "torch" (no package: torch's
own ``_sync`` on its group, for the record of its cost; the same winners). Event "sync": the winners by op
(index, template uid, keyword arguments) or the error. With CCOL_AUTOTUNE_ABSENT=r
(for the record), rank r's graph has no GEMM to autotune: it skips ``_sync``
and goes on to the step's all_reduce on the default group; event "absent"."""

from prelude import *

import torch._inductor.distributed_autotune as da
from torch._inductor.virtualized import V

case = os.environ["CCOL_AUTOTUNE_CASE"]
if case != "torch":
    cct.enable(timeout=30)

ops = [(k, f"mm_{k}", f"FixedLayout('cpu', torch.float32, size=[{8 * (k + 1)}, 16])")
       for k in range(5)]
if case == "differ" and RANK == 1:
    ops[2] = (2, "mm_2", "FixedLayout('cpu', torch.float32, size=[24, 32])")


def winner(k):
    choice = da._SerializedChoice.__new__(da._SerializedChoice)
    choice.index = k
    choice.template_uid = ("torch._inductor.kernel.mm.mm_template" if k % 2
                           else "torch._inductor.kernel.mm.aten_mm")
    choice.kwargs = {"BLOCK_M": 16 * (k + 1), "EVEN_K": k % 2 == 0, "ACC_TYPE": "'tl.float32'"}
    return choice


group = da.get_autotune_pg()
state = da._DistributedAutotuneState()
state.autotuned_index = len(ops)
state._ccol_ops = ops
V.set_distributed_autotune_state(state)
mine = [winner(k) for k in range(len(ops)) if k % group.size() == group.rank()]
if str(RANK) == os.environ.get("CCOL_AUTOTUNE_ABSENT"):
    started = time.perf_counter()
    dist.all_reduce(torch.ones(4))
    emit(ev="absent", seconds=time.perf_counter() - started)
    sys.exit(0)
try:
    started = time.perf_counter()
    out = da._sync(mine)
    seconds = time.perf_counter() - started
    emit(ev="sync", group=[group.rank(), group.size()], seconds=seconds,
         winners=[[c.index, c.template_uid, c.kwargs, type(c).__name__] for c in out],
         tags=sorted(t for t in dist.distributed_c10d._world.tags_to_pg if "pt2_" in t))
except compiler_collectives.Error as e:
    emit(ev="sync", group=[group.rank(), group.size()], error=type(e).__name__, message=str(e),
         key=e.key, exchange=e.exchange,
         tags=sorted(t for t in dist.distributed_c10d._world.tags_to_pg if "pt2_" in t))
