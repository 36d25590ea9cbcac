"""Inductor's distributed GEMM autotuning on compiler_collectives' channel, on
CUDA GPUs: the real path, which a CPU never takes (it needs several GEMM
choices, and Inductor's CPU templates do not serialize).

Run it under torchrun (one rank per GPU), or alone (a world of one)::

    torchrun --standalone --nproc-per-node N crates/python/examples/distributed_autotune_gpu.py
    python crates/python/examples/distributed_autotune_gpu.py

With ``torch._inductor.config.distributed_max_autotune_gemm`` on, each rank
autotunes the GEMMs it owns (op k by rank k % N) and the package's ``_sync``
shares the winners on its channel. It checks that the compiled result equals
eager's, that ``_sync`` ran once per graph with every op's winner, and that
no torch group was created for it; prints one JSON line per rank ("ok" true
or false) and exits 1 on a failure, 77 when there is no CUDA device.
``scripts/gpu-check.sh`` runs it where torch, CUDA and the package are
installed.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import tempfile


def main() -> int:
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        print(json.dumps({"ok": None, "skipped": "no CUDA device"}), flush=True)
        return 77
    if "RANK" in os.environ:
        dist.init_process_group("nccl", timeout=datetime.timedelta(minutes=10))
    else:
        store = os.path.join(tempfile.mkdtemp(), "store")
        dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
    rank = dist.get_rank()
    torch.cuda.set_device(rank % torch.cuda.device_count())

    import compiler_collectives.torch as cct
    import torch._inductor.config as inductor_config
    import torch._inductor.distributed_autotune as da

    cct.enable(timeout=600)
    inductor_config.distributed_max_autotune_gemm = True
    inductor_config.max_autotune_gemm = True
    synced = []
    replaced = da._sync

    def counting(results):
        out = replaced(results)
        synced.append([(c.index, c.template_uid) for c in out])
        return out

    da._sync = counting

    @torch.compile(mode="max-autotune-no-cudagraphs")
    def f(a, b, c):
        return torch.relu(a @ b) @ c

    g = torch.Generator(device="cuda").manual_seed(0)
    a, b, c = (torch.randn(512, 512, device="cuda", dtype=torch.float16, generator=g)
               for _ in range(3))
    got = f(a, b, c)
    want = torch.relu(a @ b) @ c
    close = torch.allclose(got, want, rtol=2e-2, atol=2e-2)
    tags = sorted(t for t in dist.distributed_c10d._world.tags_to_pg if "pt2_" in t)
    ok = bool(close and synced and all(len(s) >= 2 for s in synced) and not tags)
    print(json.dumps({"rank": rank, "world": dist.get_world_size(), "ok": ok,
                      "close": bool(close), "synced": synced, "pt2_groups": tags}), flush=True)
    cct.disable()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
