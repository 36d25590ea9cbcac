"""Helpers of the package's tests: rank processes joined by a FileStore, and
child processes (torchrun jobs) whose outputs are read while they run.

Every child runs in a session of its own with both pipes read concurrently
(one reader thread per pipe), so a child that fills one pipe never blocks
while the harness waits on another. Each case has a limit: at the limit the
harness kills every process of the case (with their descendants) and fails,
naming the processes still running and showing their output tails (and
those of any process that failed).

`world_of_one` is the in-process fixture (a Gloo world of one rank) of the
enable()/disable() tests, and `replaced_objects()` what enable() replaces.

The rank programs are files in tests/ranks/; each starts with
``from prelude import *`` (tests/ranks/prelude.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

#: The rank programs (one file per case) and their shared prelude.
RANKS_DIR = Path(__file__).resolve().parent / "ranks"
#: What each stream keeps (its last bytes); what is dropped is counted.
KEEP_BYTES = 8 << 20
#: The output tail a failure shows per stream.
TAIL_CHARS = 3000


class Stream:
    """One pipe of a child, read on a thread of its own until EOF. Keeps the
    last KEEP_BYTES bytes (a flooding child costs bounded memory)."""

    def __init__(self, pipe, label: str):
        self._pipe = pipe
        self._chunks: list[bytes] = []
        self._kept = 0
        self.dropped = 0
        self.total = 0
        self.closed = threading.Event()
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, name=f"read {label}", daemon=True)
        self._thread.start()

    def _read(self):
        fd = self._pipe.fileno()
        try:
            while True:
                try:
                    chunk = os.read(fd, 1 << 16)
                except OSError:
                    break
                if not chunk:
                    break
                with self._changed:
                    self._chunks.append(chunk)
                    self._kept += len(chunk)
                    self.total += len(chunk)
                    while self._kept - len(self._chunks[0]) >= KEEP_BYTES:
                        first = self._chunks.pop(0)
                        self._kept -= len(first)
                        self.dropped += len(first)
                    self._changed.notify_all()
        finally:
            with self._changed:
                self.closed.set()
                self._changed.notify_all()
            self._pipe.close()

    def text(self) -> str:
        with self._changed:
            data = b"".join(self._chunks)
        return data.decode("utf-8", errors="replace")

    def wait_closed(self, timeout: float) -> bool:
        return self.closed.wait(max(0.0, timeout))

    def wait_for(self, needle: str, deadline: float) -> bool:
        """True once `needle` is in the kept output; False at `deadline` or EOF."""
        want = needle.encode()
        with self._changed:
            while True:
                if want in b"".join(self._chunks):
                    return True
                if self.closed.is_set():
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 1.0))

    def tail(self, chars: int = TAIL_CHARS) -> str:
        with self._changed:
            data = b"".join(self._chunks)
        last = data[-chars:]
        before = self.total - len(last)
        return (f"[... {before} bytes before]\n" if before else "") + last.decode(
            "utf-8", errors="replace"
        )


def _children(pid: int) -> list[int]:
    """The children of `pid` (every thread's), from /proc."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def kill_tree(pid: int) -> None:
    """SIGKILLs `pid` and every descendant. The tree is frozen first (SIGSTOP)
    so that no process forks or is orphaned while it is collected: torchrun
    starts each rank in a session of its own, out of reach of a group kill."""
    seen: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        try:
            os.kill(p, signal.SIGSTOP)
        except ProcessLookupError:
            continue
        seen.append(p)
        todo += _children(p)
    for p in seen:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # Until each is gone (or a zombie, dead but not yet reaped).
    end = time.monotonic() + 10.0
    for p in seen:
        while _alive(p) and time.monotonic() < end:
            time.sleep(0.01)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


class Proc:
    """A child in a session of its own, its stdout and stderr read on threads."""

    def __init__(self, name: str, argv, *, env=None, merge_stderr: bool = False):
        self.name = name
        self.popen = subprocess.Popen(
            [str(a) for a in argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        self.stdout = Stream(self.popen.stdout, f"{name} stdout")
        self.stderr = None if merge_stderr else Stream(self.popen.stderr, f"{name} stderr")
        self.killed = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self):
        return self.popen.poll()

    def wait(self, deadline: float) -> bool:
        """True once the child has exited and both pipes reached EOF (a
        descendant may still hold them: a short grace, then they are left)."""
        try:
            self.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
        grace = min(deadline, time.monotonic() + 5.0)
        for s in (self.stdout, self.stderr):
            if s is not None:
                s.wait_closed(grace - time.monotonic())
        return True

    def kill(self) -> None:
        """Kills the child and its descendants, then reaps it."""
        if self.popen.poll() is None:
            # Not reaped yet: the pid is still this child's.
            self.killed = True
            kill_tree(self.pid)
            self.popen.wait()
        streams = [s for s in (self.stdout, self.stderr) if s is not None]
        if not all(s.closed.is_set() for s in streams):
            # A descendant still holds a pipe: the child's session is its
            # process group (the group id stays taken while it has members).
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for s in streams:
            s.wait_closed(5.0)

    def tails(self) -> str:
        parts = [f"--- {self.name} stdout ({self.stdout.total} bytes) ---\n{self.stdout.tail()}"]
        if self.stderr is not None:
            parts.append(f"--- {self.name} stderr ({self.stderr.total} bytes) ---\n{self.stderr.tail()}")
        return "\n".join(parts)


def finish(procs: list[Proc], limit: float, started: float | None = None) -> None:
    """Waits for every process of a case until `limit` seconds after
    `started`; at the limit kills them all and fails, naming those still
    running and showing the output tails of those and of any that failed."""
    deadline = (time.monotonic() if started is None else started) + limit
    running = [p for p in procs if not p.wait(deadline)]
    if not running:
        return
    for p in procs:
        p.kill()
    lines = [f"{', '.join(p.name for p in running)} still running after {limit:g} s (killed):"]
    for p in procs:
        if p not in running:
            lines.append(f"{p.name} exited {p.returncode}")
    # The tails of those still running, and of those that failed (a rank
    # that exited non-zero first often says the cause).
    for p in procs:
        if p in running or p.returncode != 0:
            lines.append(p.tails())
    pytest.fail("\n".join(lines), pytrace=False)


@dataclass
class Rank:
    rank: int
    returncode: int
    events: list = field(default_factory=list)
    stderr: str = ""
    stdout: str = ""

    def event(self, name):
        """The one event named `name` (fails the test when absent)."""
        found = [e for e in self.events if e.get("ev") == name]
        assert found, f"rank {self.rank} emitted no {name!r} event; stderr:\n{self.stderr[-4000:]}"
        return found[-1]


def run_compile_once(tmp_path, dirs, check: bool = True, **env) -> list["Rank"]:
    """Two ranks of tests/ranks/compile_once.py (test_compile_once.py,
    test_shard.py), rank r's Inductor cache directory tmp_path/dirs[r] (env
    may override it); each rank's exit status 0 (with `check` off: 0, or
    killed by SIGKILL)."""
    full = {f"CCOL_CO_DIR_{r}": str(tmp_path / d) for r, d in enumerate(dirs)}
    full.update({k: str(v) for k, v in env.items()})
    (tmp_path / "job").mkdir()
    ranks = run_ranks(tmp_path / "job", 2, "compile_once.py", env=full, limit=240)
    for r in ranks:
        if check or r.returncode != -9:
            assert r.returncode == 0, r.stderr[-3000:]
    return ranks


def event_of(rank: "Rank", name: str) -> dict:
    """The one event `name` of a rank of tests/ranks/compile_once.py."""
    found = [e for e in rank.events if e["event"] == name]
    assert len(found) == 1, (rank.events, rank.stderr[-3000:])
    return found[0]


def rank_program(name: str) -> Path:
    path = RANKS_DIR / name
    assert path.is_file(), f"no rank program {path}"
    return path


def run_cases(tmp_path_factory, program: str, cases, world: int = 2) -> list["Rank"]:
    """Runs tests/ranks/`program` once for all of `cases` (its CASE, comma
    separated), each rank's exit status 0."""
    ranks = run_ranks(tmp_path_factory.mktemp(program.removesuffix(".py")), world, program,
                      env={"CASE": ",".join(cases)})
    for r in ranks:
        assert r.returncode == 0, r.stderr[-3000:]
    return ranks


def run_ranks(tmp_path, world: int, program: str, *, limit: float = 240, env=None) -> list[Rank]:
    """Runs tests/ranks/`program` in `world` Python processes (one per rank),
    joined by torch's FileStore. The program starts with
    ``from prelude import *``: RANK, WORLD, emit(**kv), torch, dist,
    compiler_collectives and cct (compiler_collectives.torch).
    Every process is killed after `limit` seconds (the test then fails,
    naming the ranks still running)."""
    script = rank_program(program)
    store = tmp_path / "store"
    base = dict(os.environ)
    base.setdefault("GLOO_SOCKET_IFNAME", "lo")
    base["OMP_NUM_THREADS"] = "1"
    base.pop("CCOL_TIMEOUT_S", None)
    started = time.monotonic()
    procs: list[Proc] = []
    try:
        for r in range(world):
            e = dict(base)
            if env:
                e.update({k: v.format(rank=r, tmp=tmp_path) for k, v in env.items()})
            procs.append(
                Proc(f"rank {r}", [sys.executable, script, r, world, store], env=e)
            )
        finish(procs, limit, started)
    finally:
        for p in procs:
            if p.popen.poll() is None:
                p.kill()
    ranks = []
    for r, p in enumerate(procs):
        out = p.stdout.text()
        events = [json.loads(l[6:]) for l in out.splitlines() if l.startswith("EVENT ")]
        ranks.append(Rank(r, p.returncode, events, p.stderr.text(), out))
    return ranks


@pytest.fixture(scope="module")
def world_of_one(tmp_path_factory):
    """torch's default process group as a Gloo world of one rank, for one
    test module (kept when already initialised); on teardown disables the
    package and destroys the group."""
    import datetime

    import torch.distributed as dist

    import compiler_collectives.torch as cct

    if dist.is_initialized():
        yield
        return
    store = tmp_path_factory.mktemp("store") / "store"
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=0, world_size=1,
        timeout=datetime.timedelta(seconds=60),
    )
    yield
    cct.disable()
    dist.destroy_process_group()


def count_compiles(sizes=(3, 3, 5, 7)) -> list:
    """tests/ranks/steps.py's ``count_compiles`` in this process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ccol_rank_steps", RANKS_DIR / "steps.py")
    steps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(steps)
    return steps.count_compiles(sizes)


def replaced_objects() -> dict:
    """What enable() replaces (and disable() restores), by name."""
    import torch
    import torch._dynamo.convert_frame as cf
    import torch._dynamo.distributed as dd
    import torch._dynamo.eval_frame as ef
    import torch._dynamo.output_graph as og

    return {
        "run_compiler_collective": og.OutputGraph.__dict__["run_compiler_collective"],
        "distributed.get_compile_pg": dd.get_compile_pg,
        "convert_frame.get_compile_pg": cf.get_compile_pg,
        "CatchErrorsWrapper.__call__": cf.CatchErrorsWrapper.__dict__["__call__"],
        "guard_collectives_hook": ef.guard_collectives_hook,
        "enable_compiler_collectives": torch._dynamo.config.enable_compiler_collectives,
    }
