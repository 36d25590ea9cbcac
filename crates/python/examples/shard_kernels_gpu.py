"""Sharded compilation on CUDA: two ranks on one GPU, each with its own
Inductor and Triton cache directories, ``enable(compile_once=True,
shard_kernels=True)``: both ranks lower each graph, each Triton kernel is
built by one rank, and its Triton cache entries reach the other over the
package's channel (scripts/gpu-check.sh runs it; on a machine without CUDA
it runs on the CPU, where its kernels are C++, for a check of the script
itself).

    torchrun --standalone --nproc-per-node 2 shard_kernels_gpu.py

Each rank prints one JSON line: whether sharding was active (this rank built
a share and received the other's: ``active``), the package's counters, the
entries of its Triton cache directory, and the loss; rank 0's line ends with
``"ok": true`` when both ranks' losses are equal to the bit, each kernel was
built by one rank (the ranks' builds add up to one rank's kernels, none fell
back) and both Triton cache directories hold the same entries.

Both ranks are ``cuda:0``: the step cannot show that ranks on ``cuda:0``
and ``cuda:3`` name a kernel alike (tests/test_shard.py does, on CPU)."""

from __future__ import annotations

import json
import os
import sys
import tempfile

rank = int(os.environ.get("RANK", "0"))
# Before torch reads them: a directory of each rank's own, and Inductor's
# pool (sharding needs compile_threads >= 2).
base = tempfile.mkdtemp(prefix=f"ccol-shard-gpu-{rank}-")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(base, "inductor")
os.environ["TRITON_CACHE_DIR"] = os.path.join(base, "triton")
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "2")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

import compiler_collectives.torch as cct  # noqa: E402


def main() -> int:
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    cct.enable(timeout=60, compile_once=True, shard_kernels=True)
    torch.manual_seed(0)
    # Several fused pointwise and reduction kernels, forward and backward.
    model = torch.nn.Sequential(*(m for _ in range(3) for m in (
        torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.GELU()))).to(device)
    step = torch.compile(lambda x: model(x).square().mean(), backend="inductor")
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(7)).to(device)
    loss = step(x)
    loss.backward()
    package = dict(counters["compiler_collectives"])
    triton = os.environ["TRITON_CACHE_DIR"]
    entries = sorted(os.listdir(triton)) if os.path.isdir(triton) else []
    mine = {"loss": float.hex(loss.item()), "built": package.get("shard_kernels_built", 0),
            "received": package.get("shard_kernels_received", 0),
            "fell_back": package.get("shard_kernels_fell_back", 0), "entries": entries}
    got = [None] * world
    dist.all_gather_object(got, mine)
    active = mine["built"] > 0 and mine["received"] > 0
    line = {"rank": rank, "device": str(device), "active": active, "package": package,
            "triton_entries": len(entries), "loss": mine["loss"]}
    if rank == 0:
        # Each rank receives what the other built: the kernels of the job
        # are the builds of both, each once.
        once = all(g["received"] == sum(h["built"] for h in got) - g["built"] for g in got)
        line["ok"] = bool(all(g["built"] > 0 for g in got) and once
                          and not any(g["fell_back"] for g in got)
                          and len({g["loss"] for g in got}) == 1
                          and len({tuple(g["entries"]) for g in got}) == 1)
    print(json.dumps(line), flush=True)
    cct.disable()
    dist.destroy_process_group()
    return 0 if rank != 0 or line["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
