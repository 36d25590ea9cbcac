"""The test harness itself (conftest.py): ranks' outputs are read while they
run, and a case's limit kills every process of the case, descendants
included, and fails naming those still running."""

from __future__ import annotations

import os
import sys
import time

import pytest

from conftest import Proc, finish, rank_program, run_ranks

#: The limit of the cases that must reach it (seconds).
LIMIT = 10


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, killed and not yet reaped by init, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def read_pid(path, deadline: float = 5.0) -> int:
    end = time.monotonic() + deadline
    while not path.exists():
        assert time.monotonic() < end, f"no {path}"
        time.sleep(0.05)
    return int(path.read_text())


def test_a_rank_flooding_stderr_before_a_barrier_does_not_block_the_others(tmp_path):
    # Read one rank after another, rank 1 blocks on its full stderr pipe
    # while rank 0 waits for it at the barrier.
    ranks = run_ranks(tmp_path, 2, "flood_before_barrier.py", limit=120)
    for r in ranks:
        assert r.returncode == 0, r.stderr[-3000:]
        r.event("done")
    assert ranks[1].stderr.count("rank 1 says ") == 40000


def test_at_the_limit_a_rank_that_failed_first_shows_its_output(tmp_path):
    # Rank 0 exits 1 with its cause on stderr; rank 1 still waits at the
    # limit. The failure names rank 1 and shows rank 0's cause too.
    with pytest.raises(pytest.fail.Exception) as failed:
        run_ranks(tmp_path, 2, "fails_while_other_waits.py", limit=LIMIT)
    text = str(failed.value)
    assert text.startswith(f"rank 1 still running after {LIMIT} s (killed):"), text[:2000]
    assert "rank 0 exited 1" in text, text[:2000]
    assert "--- rank 0 stderr (" in text and "rank 0 fails: the cause of this case" in text, text
    assert "--- rank 1 stdout (" in text and "rank 1 waits" in text, text


def test_the_limit_kills_a_rank_flooding_stderr_and_fails_naming_it(tmp_path):
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as failed:
        run_ranks(tmp_path, 2, "flood_stderr.py", limit=LIMIT)
    took = time.monotonic() - start
    text = str(failed.value)
    # Named, with the others' exits and its output's tail.
    assert text.startswith(f"rank 1 still running after {LIMIT} s (killed):"), text[:2000]
    assert "rank 0 exited 0" in text, text[:2000]
    # (the rank and its child write to the same pipe)
    assert "--- rank 1 stderr (" in text, text[:500]
    assert "flood from rank 1: xxxx" in text or "flood from child: xxxx" in text, text[:500]
    assert "rank 0 stderr" not in text
    # At the limit, not later (the flood is read to the end, then killed).
    assert LIMIT <= took < LIMIT + 15, took
    # The rank and the child it forked are both gone.
    for who in ("rank1", "child"):
        pid = read_pid(tmp_path / f"pid-{who}")
        assert not alive(pid), (who, pid)


def test_the_limit_kills_a_job_whose_workers_run_in_sessions_of_their_own(tmp_path):
    # torchrun starts each rank in a session of its own: a group kill of
    # torchrun does not reach them; the harness kills the whole tree.
    job = Proc("job", [sys.executable, rank_program("job_with_worker.py"), tmp_path / "pid"],
               env=dict(os.environ))
    assert job.stdout.wait_for("started", time.monotonic() + 120), job.tails()
    worker = read_pid(tmp_path / "pid")
    assert alive(worker)
    with pytest.raises(pytest.fail.Exception) as failed:
        finish([job], 1)
    text = str(failed.value)
    assert text.startswith("job still running after 1 s (killed):"), text
    assert "--- job stdout (8 bytes) ---\nstarted" in text, text
    assert job.killed and job.returncode is not None
    assert not alive(worker)
