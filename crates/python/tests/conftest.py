"""Helpers of the package's tests: rank processes joined by a FileStore."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field

import pytest

PRELUDE = '''
import datetime, json, os, sys, time
import torch
import torch.distributed as dist
RANK, WORLD, STORE = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def emit(**kv):
    print("EVENT " + json.dumps(kv), flush=True)
dist.init_process_group("gloo", init_method=f"file://{STORE}", rank=RANK, world_size=WORLD,
                        timeout=datetime.timedelta(seconds=120))
import compiler_collectives
import compiler_collectives.torch as cct
'''


@dataclass
class Rank:
    rank: int
    returncode: int
    events: list = field(default_factory=list)
    stderr: str = ""

    def event(self, name):
        """The one event named `name` (fails the test when absent)."""
        found = [e for e in self.events if e.get("ev") == name]
        assert found, f"rank {self.rank} emitted no {name!r} event; stderr:\n{self.stderr[-4000:]}"
        return found[-1]


def run_ranks(tmp_path, world: int, body: str, *, limit: float = 240, env=None) -> list[Rank]:
    """Runs PRELUDE + `body` in `world` Python processes (one per rank),
    joined by torch's FileStore. The body sees RANK, WORLD, emit(**kv),
    torch, dist, compiler_collectives and cct (compiler_collectives.torch).
    Every process is killed after `limit` seconds (the test then fails)."""
    script = tmp_path / "rank.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    store = tmp_path / "store"
    base = dict(os.environ)
    base.setdefault("GLOO_SOCKET_IFNAME", "lo")
    base["OMP_NUM_THREADS"] = "1"
    base.pop("CCOL_TIMEOUT_S", None)
    procs = []
    for r in range(world):
        e = dict(base)
        if env:
            e.update({k: v.format(rank=r, tmp=tmp_path) for k, v in env.items()})
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), str(r), str(world), str(store)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=e,
            )
        )
    deadline = time.monotonic() + limit
    ranks = []
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"rank {r} still running after {limit} s")
        events = [json.loads(l[6:]) for l in out.splitlines() if l.startswith("EVENT ")]
        ranks.append(Rank(r, p.returncode, events, err))
    return ranks
