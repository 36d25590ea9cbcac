"""The rank program of test_versions.py::test_no_torch_group_for_functorchs_sync_in_a_2_rank_job.

A compiled step whose joint graph holds a functional collective, through
the min-cut partitioner (where functorch's _sync_decision_cross_ranks
runs). CASE=package: with compiler_collectives.torch enabled (the sync
flags off); CASE=flag_on: torch alone with _sync_decision_cross_ranks on
(the control: from torch 2.15 it creates the 'pt2_compile_sync_pg' group)."""

from prelude import *

import torch._functorch.config as fc
import torch.distributed._functional_collectives as funcol

c10d = dist.distributed_c10d
case = os.environ["CASE"]
before = set(c10d._world.pg_map)


@torch.compile(backend="aot_eager_decomp_partition")
def f(x):
    s = funcol.all_reduce(x.detach().sum().reshape(1), "sum", dist.group.WORLD)
    return (x.sin() * s).sum()


def steps():
    grads = []
    for n in (4, 4):
        x = torch.ones(n, requires_grad=True)
        f(x).backward()
        grads.append(x.grad.tolist())
    return grads


if case == "package":
    cct.enable(timeout=60)
    grads = steps()
    cct.disable()
else:
    with fc.patch("_sync_decision_cross_ranks", True):
        grads = steps()
tags = sorted(t for t in c10d._world.tags_to_pg if "pt2_" in t)
emit(ev="done", new_groups=len(set(c10d._world.pg_map) - before), tags=tags, grads=grads)
