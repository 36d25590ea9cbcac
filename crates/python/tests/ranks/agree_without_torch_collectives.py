"""The rank program of test_ranks.py::test_ranks_agree_on_dynamic_dims_without_torch_collectives."""

from prelude import *
from steps import *

calls = {}
def counting(name):
    real = getattr(dist, name)
    def call(*a, **k):
        calls[name] = calls.get(name, 0) + 1
        return real(*a, **k)
    setattr(dist, name, call)
for name in ["all_gather_object", "all_gather", "all_reduce", "broadcast", "barrier", "new_group"]:
    counting(name)
import torch.distributed.distributed_c10d as c10d
real_new = c10d._new_group_with_tag
def new_group_with_tag(*a, **k):
    calls["_new_group_with_tag"] = calls.get("_new_group_with_tag", 0) + 1
    return real_new(*a, **k)
c10d._new_group_with_tag = new_group_with_tag
cct.enable(timeout=30)
run([[5, 8, 6], [6, 6, 3]][RANK])
from torch._dynamo import distributed as dd
emit(ev="done", compiles=compiles, calls=calls, next=cct.channel_info()["next_exchange"],
     made=[dd._COMPILE_PG is not None, dd._GUARD_PG is not None])
cct.disable()
