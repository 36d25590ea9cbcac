"""Rank 0 of a mixed Python + Rust process group (see ../python_interop.rs).

Joins with torch.distributed.init_process_group("cpu:gloo", "env://") as a
rank under torchrun's agent does (TORCHELASTIC_USE_AGENT_STORE=True: the
TCPStore is served by the test, every rank is a client) — torch's own store
and group naming — then exchanges a variable-length byte payload the way
compiler-collectives' c10d transport does (a lengths round, then a round
padded to the longest) and checks every rank's payload byte for byte.
"""

import os
import sys
from datetime import timedelta

os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def payload(rank: int) -> bytes:
    return f"rank-{rank}:".encode() + bytes((rank * 31 + i) % 251 for i in range(rank * 13 + 5))


def main() -> int:
    world = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("cpu:gloo", init_method="env://", timeout=timedelta(seconds=60))
    mine = payload(0)
    lens = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(lens, torch.tensor([len(mine)], dtype=torch.int64))
    longest = max(int(x.item()) for x in lens)
    buf = torch.zeros(longest, dtype=torch.uint8)
    buf[: len(mine)] = torch.tensor(list(mine), dtype=torch.uint8)
    outs = [torch.zeros(longest, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(outs, buf)
    for r in range(world):
        got = bytes(outs[r][: int(lens[r].item())].tolist())
        if got != payload(r):
            print(f"PYTHON MISMATCH rank {r}: {got!r}", flush=True)
            return 1
    print(f"PYTHON OK {world} payloads", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
