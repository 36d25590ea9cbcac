"""The rank program of test_versions.py::test_no_torch_group_for_functorchs_sync_in_a_2_rank_job.

A compiled step whose joint graph holds a functional collective, through
the min-cut partitioner, where functorch's _sync_decision_cross_ranks runs
(on), with compiler_collectives.torch enabled (cache_agreement=True). It
counts the torch process groups created meanwhile ("groups" event). Then,
where torch has the group functorch's sync would use (2.15 on:
torch._dynamo.distributed.get_compile_sync_pg), the control: creating that
group the way the sync does, counted the same way ("control" event)."""

from prelude import *

import torch.distributed._functional_collectives as funcol

c10d = dist.distributed_c10d


def groups(before):
    """The process groups created since `before`, and the pt2 tags."""
    tags = sorted(t for t in c10d._world.tags_to_pg if "pt2_" in t)
    return len(set(c10d._world.pg_map) - before), tags


@torch.compile(backend="aot_eager_decomp_partition")
def f(x):
    s = funcol.all_reduce(x.detach().sum().reshape(1), "sum", dist.group.WORLD)
    return (x.sin() * s).sum()


import torch._functorch.config as functorch_config  # noqa: E402

functorch_config._sync_decision_cross_ranks = True
before = set(c10d._world.pg_map)
cct.enable(timeout=60, cache_agreement=True)
grads = []
for n in (4, 4):
    x = torch.ones(n, requires_grad=True)
    f(x).backward()
    grads.append(x.grad.tolist())
exchanges = cct.channel_info()["next_exchange"]
cct.disable()
functorch_config._sync_decision_cross_ranks = False
new_groups, tags = groups(before)
emit(ev="groups", new_groups=new_groups, tags=tags, grads=grads, exchanges=exchanges)

import torch._dynamo.distributed as dd  # noqa: E402

if hasattr(dd, "get_compile_sync_pg"):
    dd.get_compile_sync_pg()
    new_groups, tags = groups(before)
    emit(ev="control", new_groups=new_groups, tags=tags)
