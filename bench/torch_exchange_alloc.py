#!/usr/bin/env python3
"""The Python allocations of one ``exchange_local_state`` call of the
compiler_collectives package: what building Dynamo's states costs.

Usage (in the torch environment, after ``scripts/setup-python.sh``)::

    "$CCOL_TORCH_PYTHON" bench/torch_exchange_alloc.py [--ranks 2,4]
        [--sources 200,2000] [--states differ,same] [--calls 12] [--json]

For each world size it starts that many rank processes (CPU Gloo over a
FileStore); every rank builds a ``LocalState`` of ``--sources`` tensor
entries (``differ``: a third of them with a rank-dependent dim 0; ``same``:
every rank's state alike) and calls the package's exchange ``--calls``
times, each after a barrier, with the garbage collector off and the result
kept until the next call. Rank 0 reports, as medians over the calls after
the first two: tracemalloc's bytes still allocated when the call returns
(what it built and handed back) and its peak during the call, and the net
number of Python memory blocks allocated (``sys.getallocatedblocks``).
Run it with ``PYTHONPATH`` pointing at another build of the package to
compare two builds.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from torch_compiler_collective import run_ranks  # noqa: E402


def worker(rank: int, world: int, store: str, sources: int, states: str, calls: int) -> None:
    import datetime
    import gc
    import tracemalloc

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(minutes=5))
    import compiler_collectives.torch as cct
    from torch._dynamo.pgo import FrameStateSizeEntry
    from torch._dynamo.symbolic_convert import LocalState

    cct.enable(timeout=120)
    channel = cct._state.current.channel
    entries = {}
    for i in range(sources):
        dim0 = 4 + (rank if states == "differ" and i % 3 == 0 else 0)
        entries[f"L['x{i}']"] = FrameStateSizeEntry.make_tensor((dim0, 8), (8, 1))
    local = LocalState(automatic_dynamic=entries)

    def exchange():
        try:
            return channel.exchange_local_state("bench", local, True)
        except TypeError:  # a build before the joinable argument
            return channel.exchange_local_state("bench", local)

    held, peaks, blocks = [], [], []
    out = None
    gc.disable()
    for _ in range(calls):
        dist.barrier()
        out = None
        before = sys.getallocatedblocks()
        tracemalloc.start()
        out = exchange()
        now, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        blocks.append(sys.getallocatedblocks() - before)
        held.append(now)
        peaks.append(peak)
    gc.enable()
    cct.disable()
    print(json.dumps({"rank": rank, "states_handed": len(out), "held": held, "peak": peaks,
                      "blocks": blocks}), flush=True)
    dist.destroy_process_group()


def main(argv) -> int:
    if argv and argv[0] == "--worker":
        worker(int(argv[1]), int(argv[2]), argv[3], int(argv[4]), argv[5], int(argv[6]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--sources", default="200,2000")
    ap.add_argument("--states", default="differ,same")
    ap.add_argument("--calls", type=int, default=12)
    ap.add_argument("--json", action="store_true", help="one JSON line per row")
    a = ap.parse_args(argv)
    if a.calls < 3:
        ap.error("--calls must be at least 3 (the first two are not counted)")
    p50 = statistics.median
    for world in [int(x) for x in a.ranks.split(",")]:
        for sources in [int(x) for x in a.sources.split(",")]:
            for states in a.states.split(","):
                r0 = run_ranks(__file__, world, [sources, states, a.calls])[0]
                row = {"ranks": world, "sources": sources, "states": states,
                       "states_handed": r0["states_handed"],
                       "held_kib_p50": p50(r0["held"][2:]) / 1024,
                       "peak_kib_p50": p50(r0["peak"][2:]) / 1024,
                       "blocks_p50": p50(r0["blocks"][2:])}
                if a.json:
                    print(json.dumps(row), flush=True)
                else:
                    print(f"{world} ranks x {sources} sources, {states}: Dynamo handed "
                          f"{row['states_handed']} state(s); held {row['held_kib_p50']:.1f} KiB, "
                          f"peak {row['peak_kib_p50']:.1f} KiB, {row['blocks_p50']:.0f} blocks",
                          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
