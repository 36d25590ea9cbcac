"""A rank of test_interrupt.py: rank 0 waits in an exchange for rank 1,
which stays silent until the file GO exists; the test sends rank 0 SIGINT.

argv: rank, world size, FileStore path, GO path. Prints one JSON line per
event (``EVENT {...}``), with ``time.time()`` stamps."""

import datetime
import json
import os
import signal
import sys
import time

# Python's own SIGINT handler, as an interactive run has it: a process
# started with SIGINT ignored (bash starts a background job so, e.g.
# `./scripts/test.sh &`) keeps it ignored, and then no Ctrl-C reaches it.
signal.signal(signal.SIGINT, signal.default_int_handler)

import torch
import torch.distributed as dist

import compiler_collectives
import compiler_collectives.torch as cct

RANK, WORLD, STORE, GO = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]


def emit(**kv):
    print("EVENT " + json.dumps(dict(kv, t=time.time())), flush=True)


dist.init_process_group("gloo", init_method=f"file://{STORE}", rank=RANK, world_size=WORLD,
                        timeout=datetime.timedelta(seconds=120))
# exchange="always": rank 0's recompile is an exchange rank 1 is not in.
cct.enable(timeout=60, guard_votes=os.environ.get("GUARD_VOTES") == "1", exchange="always")


@torch.compile(backend="eager")
def f(x):
    return (x * 2).sum()


f(torch.ones(4, 8))
if RANK == 0:
    emit(ev="waiting")
    try:
        f(torch.ones(6, 8))  # a recompile: an exchange rank 1 is not in
        emit(ev="done", error=None)
    except KeyboardInterrupt:
        emit(ev="interrupted", info=cct.channel_info() is not None)
    cct.disable()
else:
    while not os.path.exists(GO):
        time.sleep(0.01)
    emit(ev="entering")
    try:
        f(torch.ones(6, 8))
        emit(ev="done", error=None)
    except compiler_collectives.Error as e:
        emit(ev="done", error=e.kind, missing=e.missing_ranks, departures=e.departures)
