"""The rank program of test_agreements.py's FSDP2 case: ``fully_shard`` on a
CPU Gloo mesh with uneven shards (a Linear(8, 5) weight over 2 ranks: 3 rows
on rank 0, 2 on rank 1; no shard of one row, which Dynamo would specialize
on that rank alone, a recompile the others do not take), under ``enable(check_graphs=True)``, several steps.

torch.compile compiles no graph of an FSDP2 module itself (its hooks run
under ``torch._dynamo.disable``, torch 2.13-2.15), so what is compiled is
what such jobs compile around it: the loss of the module's output, and the
SGD update of each parameter's local shard, whose static shapes differ
across ranks. Event "done": the losses, the exchanges and the counted torch
comms during compiles (none: FSDP2's own collectives run outside them)."""

from prelude import *

import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch 2.13 keeps it here too
    from torch.distributed._composable.fsdp import fully_shard

import torch_comms

cct.enable(timeout=float(os.environ.get("CCOL_GRAPH_TIMEOUT", "30")), check_graphs=True)
torch_comms.install()
torch.manual_seed(0)
mesh = init_device_mesh("cpu", (WORLD,))
model = nn.Sequential(nn.Linear(8, 5), nn.ReLU(), nn.Linear(5, 4))
for layer in (model[0], model[2]):
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
shards = sorted({tuple(p.to_local().shape) for p in model.parameters()})


@torch.compile(backend="aot_eager")
def loss_of(out, target):
    return ((out - target) ** 2).mean()


@torch.compile(backend="aot_eager")
def sgd(p, g):
    return p - 0.1 * g


x = torch.linspace(-1, 1, 32).reshape(4, 8)
target = torch.linspace(0, 1, 16).reshape(4, 4)
losses = []
for step in range(4):
    loss = loss_of(model(x), target)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            local = p.to_local()
            local.copy_(sgd(local, p.grad.to_local()))
            p.grad = None
    losses.append(loss.item())
emit(ev="done", losses=losses, shards=shards, exchanges=cct.channel_info()["next_exchange"],
     torch_comms=torch_comms.calls)
cct.disable()
