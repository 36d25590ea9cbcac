"""compile_once on CUDA: two ranks on one GPU, each with its own Inductor and
Triton cache directories, so that the graph one rank compiles reaches the
other over the package's channel, Triton's kernels bundled into the FX graph
entry (scripts/gpu-check.sh runs it; on a machine without CUDA it runs on
the CPU, for a check of the script itself).

    torchrun --standalone --nproc-per-node 2 compile_once_gpu.py

Each rank prints one JSON line: whether compile_once was active (one rank
compiled, the other received and loaded: ``active``), the package's
counters, the Inductor compiles counted here, and the loss; rank 0's line
ends with ``"ok": true`` when both ranks' losses are equal to the bit to
what each computed, and the job's compiles are one rank's."""

from __future__ import annotations

import json
import os
import sys
import tempfile

rank = int(os.environ.get("RANK", "0"))
# Before torch reads them: a directory of each rank's own.
base = tempfile.mkdtemp(prefix=f"ccol-compile-once-gpu-{rank}-")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(base, "inductor")
os.environ["TRITON_CACHE_DIR"] = os.path.join(base, "triton")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch._inductor.graph as inductor_graph  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

import compiler_collectives.torch as cct  # noqa: E402

lowerings = [0]
_init = inductor_graph.GraphLowering.__init__


def _counting(self, *args, **kwargs):
    lowerings[0] += 1
    _init(self, *args, **kwargs)


inductor_graph.GraphLowering.__init__ = _counting


def main() -> int:
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    cct.enable(timeout=60, compile_once=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 8)).to(device)
    step = torch.compile(lambda x: model(x).square().mean(), backend="inductor")
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(7)).to(device)
    loss = step(x)
    loss.backward()
    got = [None] * world
    dist.all_gather_object(got, {"loss": float.hex(loss.item()), "lowerings": lowerings[0]})
    package = dict(counters["compiler_collectives"])
    active = (package.get("compile_once_compiled", 0) + package.get("compile_once_received", 0)
              + package.get("compile_once_loaded_shared", 0)) > 0
    line = {"rank": rank, "device": str(device), "active": active, "package": package,
            "lowerings": lowerings[0], "loss": float.hex(loss.item())}
    if rank == 0:
        # The same input and weights on both ranks: losses equal to the bit,
        # and one rank's compiles (forward and backward) in the job.
        line["ok"] = bool(active and len({g["loss"] for g in got}) == 1
                          and sum(g["lowerings"] for g in got) == 2)
    print(json.dumps(line), flush=True)
    cct.disable()
    dist.destroy_process_group()
    return 0 if rank != 0 or line["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
