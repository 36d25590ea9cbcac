"""Ctrl-C during a wait: KeyboardInterrupt at once, and the peers learn that
this rank aborted. A deadline test: run it alone (``pytest -rP -k interrupt``, which also
prints the figures), not beside a loaded machine's other timing tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PROGRAM = Path(__file__).resolve().parent / "programs" / "interrupt_rank.py"
#: How long after the SIGINT rank 0 must have its KeyboardInterrupt (s).
INTERRUPT_BOUND = 0.5
#: How long after entering its exchange rank 1 must get PeerLost (s).
PEER_BOUND = 1.0


def events(text: str) -> dict:
    return {e["ev"]: e for e in (json.loads(l[6:]) for l in text.splitlines() if l.startswith("EVENT "))}


@pytest.mark.parametrize("guard_votes", [False, True])
def test_ctrl_c_in_a_wait_raises_at_once_and_the_peer_gets_peer_lost_naming_it(tmp_path, guard_votes):
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
               GUARD_VOTES="1" if guard_votes else "0")
    env.pop("CCOL_TIMEOUT_S", None)
    go = tmp_path / "go"
    store = tmp_path / "store"
    outs = [open(tmp_path / f"rank{r}.out", "w+") for r in range(2)]
    procs = [
        subprocess.Popen([sys.executable, str(PROGRAM), str(r), "2", str(store), str(go)],
                         stdout=outs[r], stderr=subprocess.STDOUT, text=True, env=env)
        for r in range(2)
    ]
    try:
        deadline = time.monotonic() + 120
        while "waiting" not in events((tmp_path / "rank0.out").read_text()):
            assert procs[0].poll() is None, (tmp_path / "rank0.out").read_text()[-3000:]
            assert time.monotonic() < deadline, "rank 0 never reached its exchange"
            time.sleep(0.05)
        time.sleep(1.0)  # well inside the exchange's wait
        sent = time.time()
        procs[0].send_signal(signal.SIGINT)
        procs[0].wait(timeout=60)
        go.touch()
        procs[1].wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    out0 = (tmp_path / "rank0.out").read_text()
    out1 = (tmp_path / "rank1.out").read_text()
    ev0, ev1 = events(out0), events(out1)
    assert "interrupted" in ev0, out0[-3000:]
    # The figures (shown by ``pytest -rP``).
    print(f"guard_votes={guard_votes}: KeyboardInterrupt {ev0['interrupted']['t'] - sent:.3f} s "
          f"after SIGINT; the peer's PeerLost {ev1.get('done', {}).get('t', float('nan')) - ev1.get('entering', {}).get('t', float('nan')):.3f} s "
          "after entering its exchange")
    assert ev0["interrupted"]["t"] - sent <= INTERRUPT_BOUND, (ev0["interrupted"]["t"] - sent, out0[-2000:])
    done = ev1["done"]
    assert done["error"] == "peer_lost", out1[-3000:]
    assert done["missing"] == [0]
    assert done["departures"] == [[0, "aborted"]]
    assert done["t"] - ev1["entering"]["t"] <= PEER_BOUND, (done["t"] - ev1["entering"]["t"], out1[-2000:])
    assert procs[0].returncode == 0 and procs[1].returncode == 0, (out0[-2000:], out1[-2000:])
