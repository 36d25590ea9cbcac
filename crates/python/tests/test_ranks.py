"""compiler_collectives.torch on real rank processes: decisions, errors a
caller can catch, deadlines, guard votes, torchrun's error file."""

from __future__ import annotations

import json

from conftest import run_ranks

# A compiled function, a counting backend, and the step loop. Each rank's
# sizes come from SIZES[RANK]; the body may set BEFORE_STEP(step).
PROGRAM = """
compiles = []
def backend(gm, example_inputs):
    from torch.fx.experimental.symbolic_shapes import free_symbols
    dyn = []
    for node in gm.graph.nodes:
        v = node.meta.get("example_value") if node.op == "placeholder" else None
        if isinstance(v, torch.Tensor):
            dyn += [i for i, d in enumerate(v.size()) if free_symbols(d)]
    compiles.append(dyn)
    return gm.forward

@torch.compile(backend=backend)
def f(x):
    return (x * 2).sum()

def run(sizes, before_step=None):
    for step, n in enumerate(sizes):
        if before_step is not None:
            before_step(step)
        f(torch.ones(n, 8))
"""


def test_ranks_agree_on_dynamic_dims_without_torch_collectives(tmp_path):
    # docs/scenarios.md scenario 1: x = (s, 8), s = 5,8,6 on rank 0 and
    # 6,6,3 on rank 1: with the exchange, one compile each, dim 0 dynamic.
    body = PROGRAM + """
calls = {}
def counting(name):
    real = getattr(dist, name)
    def call(*a, **k):
        calls[name] = calls.get(name, 0) + 1
        return real(*a, **k)
    setattr(dist, name, call)
for name in ["all_gather_object", "all_gather", "all_reduce", "broadcast", "barrier", "new_group"]:
    counting(name)
import torch.distributed.distributed_c10d as c10d
real_new = c10d._new_group_with_tag
def new_group_with_tag(*a, **k):
    calls["_new_group_with_tag"] = calls.get("_new_group_with_tag", 0) + 1
    return real_new(*a, **k)
c10d._new_group_with_tag = new_group_with_tag
cct.enable(timeout=30)
run([[5, 8, 6], [6, 6, 3]][RANK])
from torch._dynamo import distributed as dd
emit(ev="done", compiles=compiles, calls=calls, next=cct.channel_info()["next_exchange"],
     made=[dd._COMPILE_PG is not None, dd._GUARD_PG is not None])
cct.disable()
"""
    ranks = run_ranks(tmp_path, 2, body)
    for r in ranks:
        done = r.event("done")
        assert r.returncode == 0, r.stderr[-3000:]
        assert done["compiles"] == [[0]], done
        # Our channel: the enable check and one compile exchange.
        assert done["next"] == 2
        assert done["calls"] == {}, "a torch collective ran or a group was made"
        assert done["made"] == [False, False]


def test_ranks_at_different_frames_get_a_desync_error(tmp_path):
    # Dynamo's own exchange would merge rank 0's f with rank 1's g by
    # source name; ours names both frames.
    body = """
@torch.compile(backend="eager")
def f(x):
    return x + 1

@torch.compile(backend="eager")
def g(x):
    return x - 1

cct.enable(timeout=30)
try:
    (f if RANK == 0 else g)(torch.ones(3))
    emit(ev="done", error=None)
except compiler_collectives.Error as e:
    emit(ev="done", error=type(e).__name__, kind=e.kind, message=str(e), exchange=e.exchange)
"""
    ranks = run_ranks(tmp_path, 2, body)
    for r in ranks:
        done = r.event("done")
        assert done["error"] == "Desync", (done, r.stderr[-3000:])
        assert done["kind"] == "desync"
        assert "#1 'torch.frame" in done["message"], done["message"]
        # The keys name module, qualified name, first line and compile number,
        # never a file path.
        assert "torch.frame __main__:f:" in done["message"], done["message"]
        assert "torch.frame __main__:g:" in done["message"], done["message"]
        assert "#0" in done["message"]
        assert "rank.py" not in done["message"]


def test_ranks_with_different_dynamo_config_disagree_at_enable(tmp_path):
    body = """
torch._dynamo.config.recompile_limit = 8 if RANK == 0 else 4
try:
    cct.enable(timeout=30)
    emit(ev="done", error=None)
except compiler_collectives.Disagreement as e:
    emit(ev="done", error=e.kind, message=str(e), enabled=cct.is_enabled(),
         flag=torch._dynamo.config.enable_compiler_collectives)
"""
    for r in run_ranks(tmp_path, 2, body):
        done = r.event("done")
        assert done["error"] == "disagreement", (done, r.stderr[-3000:])
        assert "recompile_limit=8" in done["message"] and "recompile_limit=4" in done["message"]
        # A refused enable changes nothing.
        assert done["enabled"] is False
        assert done["flag"] is False


def test_a_rank_waiting_alone_times_out_naming_the_other_within_the_deadline(tmp_path):
    # Rank 1 is alive but never compiles again (sleeping); rank 0 recompiles
    # and waits alone: a Timeout naming rank 1 within the deadline + 1 s.
    body = PROGRAM + """
cct.enable(timeout=3)
f(torch.ones(4, 8))
if RANK == 1:
    time.sleep(8)
    emit(ev="done")
else:
    start = time.monotonic()
    try:
        f(torch.ones(6, 8))
        emit(ev="done", error=None)
    except compiler_collectives.Timeout as e:
        emit(ev="done", error=e.kind, missing=e.missing_ranks, exchange=e.exchange,
             waited=time.monotonic() - start, is_builtin_timeout=isinstance(e, TimeoutError))
"""
    ranks = run_ranks(tmp_path, 2, body)
    done = ranks[0].event("done")
    assert done["error"] == "timeout", (done, ranks[0].stderr[-3000:])
    assert done["missing"] == [1]
    assert done["exchange"] == 2
    assert done["is_builtin_timeout"] is True
    assert 3.0 <= done["waited"] <= 4.0, done


def test_a_failed_guard_vote_raises_on_the_recompile_path_instead_of_aborting(tmp_path):
    # An exception inside Dynamo's guard-complete hook aborts the process;
    # ours votes "miss" and the recompile raises the error. Rank 1 goes away
    # without shutting its channel down (os._exit): rank 0 loses it.
    body = PROGRAM + """
cct.enable(timeout=10, guard_votes=True)
f(torch.ones(4, 8))
if RANK == 1:
    os._exit(0)
try:
    f(torch.ones(4, 8))
    emit(ev="done", error=None)
except compiler_collectives.Error as e:
    emit(ev="done", error=type(e).__name__, kind=e.kind, missing=e.missing_ranks,
         exchange=e.exchange, chain=repr(e.__context__))
"""
    ranks = run_ranks(tmp_path, 2, body)
    assert ranks[0].returncode == 0, ranks[0].stderr[-3000:]
    done = ranks[0].event("done")
    assert done["kind"] == "peer_lost", done
    assert done["missing"] == [1]
    # #0 the enable check, #1 the compile; the vote of step 1 is #2.
    assert done["exchange"] == 2


def test_suppress_errors_does_not_turn_our_error_into_an_eager_fallback(tmp_path):
    body = PROGRAM + """
torch._dynamo.config.suppress_errors = True
cct.enable(timeout=10)
f(torch.ones(4, 8))
if RANK == 1:
    cct.disable()
    emit(ev="done")
else:
    try:
        f(torch.ones(6, 8))
        emit(ev="done", error=None, compiles=len(compiles))
    except compiler_collectives.Error as e:
        emit(ev="done", error=e.kind, missing=e.missing_ranks)
"""
    ranks = run_ranks(tmp_path, 2, body)
    done = ranks[0].event("done")
    assert done["error"] == "peer_lost", (done, ranks[0].stderr[-3000:])
    assert done["missing"] == [1]


def test_an_error_reaching_the_caller_is_written_to_the_torchelastic_error_file(tmp_path):
    body = PROGRAM + """
cct.enable(timeout=10)
f(torch.ones(4, 8))
if RANK == 1:
    cct.disable()
else:
    f(torch.ones(6, 8))   # raises PeerLost, uncaught: the process exits 1
"""
    ranks = run_ranks(
        tmp_path, 2, body, env={"TORCHELASTIC_ERROR_FILE": "{tmp}/error-{rank}.json"}
    )
    assert ranks[0].returncode == 1
    assert "compiler_collectives._errors.PeerLost" in ranks[0].stderr
    data = json.loads((tmp_path / "error-0.json").read_text())
    assert data["message"]["message"].startswith("PeerLost: lost rank [1]"), data
    assert "Traceback" in data["message"]["extraInfo"]["py_callstack"]
    assert int(data["message"]["extraInfo"]["timestamp"]) > 0
    assert ranks[1].returncode == 0
    assert not (tmp_path / "error-1.json").exists()


def test_guard_votes_make_every_rank_recompile_when_one_misses(tmp_path):
    # docs/scenarios.md scenario 8 with collectives off and votes on: rank 1
    # misses alone at step 1; both recompile.
    body = PROGRAM + """
cct.enable(timeout=30, guard_votes=True)
torch._dynamo.config.enable_compiler_collectives = False
run([[10, 10], [10, 12]][RANK])
emit(ev="done", compiles=compiles)
cct.disable()
"""
    ranks = run_ranks(tmp_path, 2, body)
    assert ranks[0].event("done")["compiles"] == [[], []]
    assert ranks[1].event("done")["compiles"] == [[], [0]]


def test_a_rank_waiting_in_an_exchange_lets_its_other_threads_run(tmp_path):
    # The wait releases the GIL: a thread of the waiting rank keeps counting
    # while rank 1 arrives two seconds late.
    body = PROGRAM + """
import threading
ticks = [0]
stop = threading.Event()
def count():
    while not stop.is_set():
        ticks[0] += 1
        time.sleep(0.01)
cct.enable(timeout=30)
if RANK == 1:
    time.sleep(2)
counter = threading.Thread(target=count)
counter.start()
start = time.monotonic()
before = ticks[0]
f(torch.ones(4, 8))
waited = time.monotonic() - start
during = ticks[0] - before
stop.set()
counter.join()
emit(ev="done", waited=waited, during=during)
cct.disable()
"""
    ranks = run_ranks(tmp_path, 2, body)
    done = ranks[0].event("done")
    assert done["waited"] >= 1.5, done
    # About 100 ticks a second while rank 0 waited; with the GIL held, none.
    assert done["during"] >= 50 * done["waited"], done


def test_compiles_in_another_thread_exchange_too(tmp_path):
    # torch 2.13's Dynamo settings are per thread: enable()'s flag reads as
    # off in a new thread, where Dynamo's own exchange would not run.
    body = PROGRAM + """
import threading
cct.enable(timeout=30)
worker = threading.Thread(target=run, args=([[4, 4, 4], [5, 6, 7]][RANK],))
worker.start()
worker.join()
emit(ev="done", compiles=compiles, next=cct.channel_info()["next_exchange"])
cct.disable()
"""
    for r in run_ranks(tmp_path, 2, body):
        done = r.event("done")
        # Step 0: 4 against 5 -> dynamic at once, on both ranks.
        assert done["compiles"] == [[0]], (done, r.stderr[-3000:])
        assert done["next"] == 2


def test_a_forked_child_does_not_hang_in_the_package(tmp_path):
    # The child's copy of the channel is forgotten, not closed (closing
    # would wait for Gloo threads that did not survive the fork). The child
    # leaves by os._exit: torch's own Gloo process group hangs a forked
    # child's normal exit, with or without this package.
    body = """
cct.enable(timeout=10)
pid = os.fork()
if pid == 0:
    enabled = cct.is_enabled()
    cct.disable()
    cct._at_exit()
    os._exit(3 if enabled else 0)
start = time.monotonic()
_, status = os.waitpid(pid, 0)
emit(ev="done", waited=time.monotonic() - start, status=status, enabled=cct.is_enabled())
cct.disable()
"""
    for r in run_ranks(tmp_path, 2, body, limit=60):
        done = r.event("done")
        assert done["status"] == 0 and done["waited"] < 5, done
        assert done["enabled"] is True


def test_ranks_compiling_different_modules_get_a_desync_error(tmp_path):
    # torch.compile(module) compiles one torch wrapper frame for every
    # module: the key names what it wraps.
    body = """
cct.enable(timeout=10)
a = torch.compile(torch.nn.Linear(4, 2), backend="eager")
b = torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), backend="eager")
try:
    (a if RANK == 0 else b)(torch.ones(3, 4))
    emit(ev="done", error=None)
except compiler_collectives.Error as e:
    emit(ev="done", error=e.kind, message=str(e))
"""
    for r in run_ranks(tmp_path, 2, body):
        done = r.event("done")
        assert done["error"] == "desync", (done, r.stderr[-3000:])
        assert "[Linear]" in done["message"] and "[Sequential]" in done["message"], done


def test_an_explicit_timeout_ignores_ccol_timeout_s(tmp_path):
    body = PROGRAM + """
cct.enable(timeout=10)
run([4, 4])
emit(ev="done", timeout=cct.channel_info()["timeout_s"], compiles=len(compiles))
cct.disable()
"""
    for r in run_ranks(tmp_path, 2, body, env={"CCOL_TIMEOUT_S": "junk"}):
        done = r.event("done")
        assert done == {"ev": "done", "timeout": 10.0, "compiles": 1}, (done, r.stderr[-3000:])


def test_a_rank_that_dies_of_an_exception_is_reported_lost_not_finished(tmp_path):
    body = PROGRAM + """
cct.enable(timeout=10)
f(torch.ones(4, 8))
if RANK == 1:
    raise RuntimeError("the real bug, on rank 1")
try:
    f(torch.ones(6, 8))
    emit(ev="done", error=None)
except compiler_collectives.PeerLost as e:
    emit(ev="done", error=e.kind, departures=e.departures, message=str(e))
"""
    ranks = run_ranks(tmp_path, 2, body)
    assert ranks[1].returncode == 1 and "the real bug, on rank 1" in ranks[1].stderr
    done = ranks[0].event("done")
    assert done["error"] == "peer_lost", done
    assert done["departures"] == [[1, "aborted"]], done
    assert "no more exchanges" not in done["message"]
