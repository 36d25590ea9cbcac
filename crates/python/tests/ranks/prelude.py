"""The shared prelude of the rank programs (tests/conftest.py's run_ranks).

A program starts with ``from prelude import *``. Its arguments are RANK,
WORLD and the FileStore's path; the prelude joins torch's Gloo process group
and gives the program RANK, WORLD, emit(**kv) (an event line the harness
reads), and datetime, json, os, sys, time, torch, dist, compiler_collectives
and cct (compiler_collectives.torch)."""

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

RANK, WORLD, STORE = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]


def emit(**kv):
    print("EVENT " + json.dumps(kv), flush=True)


# CCOL_PG_BACKEND=cpu:gloo for PyTorch's own exchange on torch 2.15 (its
# compile group lists the default group's devices by name).
# CCOL_TEST_TCP_PORT: torch's TCPStore on that port of 127.0.0.1 (rank 0
# serves it), as env:// and torchrun give; else a FileStore at STORE.
_port = os.environ.get("CCOL_TEST_TCP_PORT")
dist.init_process_group(os.environ.get("CCOL_PG_BACKEND", "gloo"),
                        init_method=f"tcp://127.0.0.1:{_port}" if _port else f"file://{STORE}",
                        rank=RANK, world_size=WORLD, timeout=datetime.timedelta(seconds=120))
import compiler_collectives  # noqa: E402
import compiler_collectives.torch as cct  # noqa: E402

__all__ = ["RANK", "WORLD", "STORE", "emit", "datetime", "json", "os", "sys", "time", "torch",
           "dist", "compiler_collectives", "cct"]
