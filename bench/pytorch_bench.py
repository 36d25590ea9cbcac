"""PyTorch's side of `ccol bench`: the same measurements on torch 2.13.

Two modes, both run by `ccol bench` (which embeds this file):

* ``exchange`` -- one rank of a gloo process group (started by ``ccol run``,
  which sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT). Per state size,
  per round: a barrier, then Dynamo's compiler-collective exchange --
  ``all_gather_object`` of a ``LocalState`` whose ``automatic_dynamic`` holds
  one ``FrameStateSizeEntry`` per source -- and the join every rank then does
  (``FrameStateSizeEntry |=`` over every rank's entries, as
  ``process_automatic_dynamic`` / ``update_automatic_dynamic`` do). The state
  is the one of ``compiler_collectives_harness::benchmark::bench_state``:
  ``sources`` tensors of shape (8, 16, 4), every third with dim 0 = 8 + rank,
  strides as Dynamo records them (InferStride).
* ``join`` -- one process: joins ``ranks`` such states of ``sources`` sources
  (median of ``repeats``), and the pickle size of one rank's state (what
  ``all_gather_object`` sends).

Each mode writes one JSON file (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import time
from collections import defaultdict


def state(sources: int, rank: int):
    from torch._dynamo.pgo import FrameStateSizeEntry, InferStride
    from torch._dynamo.symbolic_convert import LocalState

    entries = {}
    for i in range(sources):
        d0 = 8 + rank if i % 3 == 0 else 8
        size = (d0, 16, 4)
        # Contiguous strides, canonicalised as Dynamo's record_automatic_dynamic does.
        raw = (16 * 4, 4, 1)
        stride = [None] * 3
        candidates = {}
        for s, neg_i in sorted((raw[i], -i) for i in range(3)):
            i_ = -neg_i
            stride[i_] = candidates.get(s, s)
            candidates.setdefault(s * size[i_], InferStride(i_))
        entries[f"L['s{i}']"] = FrameStateSizeEntry.make_tensor(size, tuple(stride))
    return LocalState(automatic_dynamic=entries)


def join(all_states):
    from torch._dynamo.pgo import FrameStateSizeEntry

    merged = defaultdict(FrameStateSizeEntry)
    for sub in all_states:
        for name, entry in sub.automatic_dynamic.items():
            merged[name] |= entry
    return merged


def exchange(args) -> dict:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {"rank": rank, "world_size": world, "sizes": []}
    for sources in args.sources:
        local = state(sources, rank)
        times, raw = [], []
        mine = torch.zeros(16, dtype=torch.uint8)
        for r in range(args.warmup + args.rounds):
            dist.barrier()
            start = time.perf_counter()
            all_states = [None] * world
            dist.all_gather_object(all_states, local)
            join(all_states)
            elapsed = (time.perf_counter() - start) * 1e3
            # The engine alone: one 16-byte all_gather on torch's gloo.
            dist.barrier()
            start = time.perf_counter()
            dist.all_gather([torch.empty_like(mine) for _ in range(world)], mine)
            raw_ms = (time.perf_counter() - start) * 1e3
            if r >= args.warmup:
                times.append(elapsed)
                raw.append(raw_ms)
        out["sizes"].append(
            {
                "sources": sources,
                "pickle_bytes": len(pickle.dumps(local)),
                "pytorch_ms": times,
                "torch_gloo16_ms": raw,
            }
        )
    dist.barrier()
    dist.destroy_process_group()
    return out


def join_mode(args) -> dict:
    states = [state(args.sources[0], r) for r in range(args.ranks)]
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        join(states)
        times.append((time.perf_counter() - start) * 1e3)
    return {
        "ranks": args.ranks,
        "sources": args.sources[0],
        "join_ms": statistics.median(times),
        "pickle_bytes": {
            str(s): len(pickle.dumps(state(s, 1))) for s in args.pickle_sizes
        },
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["exchange", "join"])
    p.add_argument("--sources", type=lambda s: [int(x) for x in s.split(",")], required=True)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--pickle-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    result = exchange(args) if args.mode == "exchange" else join_mode(args)
    path = args.out
    if args.mode == "exchange":
        path = os.path.join(args.out, f"pytorch-rank-{result['rank']}.json")
    with open(path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
