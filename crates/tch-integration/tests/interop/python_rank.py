"""Rank 0 of a mixed Python + Rust process group (see ../python_interop.rs).

Joins with torch.distributed.init_process_group("cpu:gloo", "env://") as a
rank under torchrun's agent does (TORCHELASTIC_USE_AGENT_STORE=True: the
TCPStore is served by the test, every rank is a client) — torch's own store
and group naming — then exchanges a variable-length byte payload the way
compiler-collectives' c10d transport does (a lengths round in which every
rank sends its length and its limit as two little-endian u64 in 16 uint8
bytes, the smallest limit applying to every length; then a round padded to
the longest) and checks every rank's payload byte for byte.
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
    limit = 1 << 20  # what the Rust ranks pass as max_bytes
    entry = len(mine).to_bytes(8, "little") + limit.to_bytes(8, "little")
    rows = [torch.zeros(16, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(rows, torch.tensor(list(entry), dtype=torch.uint8))
    rows = [bytes(t.tolist()) for t in rows]
    lens = [int.from_bytes(r[:8], "little") for r in rows]
    smallest = min(int.from_bytes(r[8:], "little") for r in rows)
    if any(n > smallest for n in lens):
        print(f"PYTHON TOO LARGE {lens} over {smallest}", flush=True)
        return 1
    longest = max(lens)
    buf = torch.zeros(longest, dtype=torch.uint8)
    buf[: len(mine)] = torch.tensor(list(mine), dtype=torch.uint8)
    outs = [torch.zeros(longest, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(outs, buf)
    for r in range(world):
        got = bytes(outs[r][: lens[r]].tolist())
        if got != payload(r):
            print(f"PYTHON MISMATCH rank {r}: {got!r}", flush=True)
            return 1
    print(f"PYTHON OK {world} payloads", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
