"""Compile once per job (docs/python.md, "Compile once"): each distinct graph
is lowered by one rank of the job and loaded by the others, from a shared
cache directory or over the channel; an owner's failure reaches the ranks
waiting for it. Real ranks, Inductor on CPU (tests/ranks/compile_once.py);
each run is a few seconds of C++ builds, so the models are small."""

from __future__ import annotations

import hashlib

import pytest

from conftest import event_of as _event
from conftest import run_compile_once, run_ranks

PROGRAM = "compile_once.py"


def _run(tmp_path, dirs, **env):
    """Two ranks of tests/ranks/compile_once.py, rank r's Inductor cache
    directory tmp_path/dirs[r], kernels built in the compiling process (no
    pool of workers to start); each rank's exit status 0."""
    return run_compile_once(tmp_path, dirs, TORCHINDUCTOR_COMPILE_THREADS=1, **env)


@pytest.fixture(scope="module")
def one_node(tmp_path_factory):
    """Two ranks sharing one cache directory, two pieces, the first of them
    rank-specific: 3 distinct graph pairs in the job."""
    tmp = tmp_path_factory.mktemp("one_node")
    return tmp, _run(tmp, ["shared", "shared"], CCOL_CO_PIECES=2, CCOL_CO_RANK_SPECIFIC=1,
                     CCOL_CO_LOG="INFO")


@pytest.fixture(scope="module")
def off(tmp_path_factory):
    """The same job with the package and compile_once off, each rank its own
    directory."""
    tmp = tmp_path_factory.mktemp("off")
    return _run(tmp, ["a", "b"], CCOL_CO_PIECES=2, CCOL_CO_RANK_SPECIFIC=1,
                CCOL_CO_MODE="package_off")


def test_the_job_lowers_each_distinct_graph_once(one_node, off):
    _, ranks = one_node
    steps = [_event(r, "step") for r in ranks]
    # Forward and backward of: piece 0 on rank 0, piece 0 on rank 1, piece 1.
    assert sum(s["lowerings"] for s in steps) == 6
    assert sum(_event(r, "step")["lowerings"] for r in off) == 8
    assert sum(s["package"].get("compile_once_compiled", 0) for s in steps) == 3
    assert sum(s["package"].get("compile_once_loaded_shared", 0) for s in steps) == 1
    assert all(s["package"].get("compile_once_bytes_sent", 0) == 0 for s in steps)


def test_losses_are_equal_to_the_bit_with_compile_once_off(one_node, off):
    _, ranks = one_node
    for on, without in zip(ranks, off):
        assert _event(on, "step")["losses"] == _event(without, "step")["losses"]


def test_keys_that_differ_by_rank_are_compiled_on_their_rank_and_counted(one_node):
    _, ranks = one_node
    for r in ranks:
        package = _event(r, "step")["package"]
        assert package.get("compile_once_rank_specific") == 1, package
        assert "each group shares its own: job ranks [0]; job ranks [1]" in r.stderr


def test_a_cold_rank_receives_what_a_warm_rank_loaded(one_node, tmp_path):
    # Every rank's first piece as rank 0's in one_node (not rank-specific):
    # the warm directory holds both pieces' keys.
    warm, _ = one_node
    ranks = _run(tmp_path, ["warm", "cold"], CCOL_CO_PIECES=2, CCOL_CO_DIR_0=str(warm / "shared"))
    hot, cold = (_event(r, "step") for r in ranks)
    assert (hot["lowerings"], cold["lowerings"]) == (0, 0), (hot, cold)
    assert hot["package"]["compile_once_loaded_here"] == 2, hot
    assert cold["package"]["compile_once_received"] == 2, cold
    assert cold["package"]["compile_once_bytes_received"] == hot["package"][
        "compile_once_bytes_sent"] > 0
    assert "compile_once_kernel_misses" not in cold["package"], cold


def _owner_and_waiter(ranks):
    owners = [r for r in ranks if any(e["event"] == "owner" for e in r.events)]
    assert len(owners) == 1, [r.events for r in ranks]
    return owners[0], next(r for r in ranks if r is not owners[0])


def test_an_owner_compiling_past_the_deadline_times_nobody_out_and_its_error_reaches_the_waiter(
        tmp_path):
    # The owner compiles (sleeps) twice the exchange deadline, then raises.
    ranks = _run(tmp_path, ["a", "b"], CCOL_CO_PIECES=1, CCOL_CO_HOOK="sleep_raise=4",
                 CCOL_CO_TIMEOUT=2)
    owner, waiter = _owner_and_waiter(ranks)
    raised = _event(waiter, "raised")
    assert raised["cls"] == "PeerCompileFailed", raised
    assert raised["owner"] == owner.rank
    assert raised["exc_type"] == "builtins.RuntimeError"
    assert raised["exc_message"] == f"the owner's compile failed on purpose (job rank {owner.rank})"
    # Within a second of the owner's raise, after 4 s without a Timeout.
    assert 0 <= raised["time"] - _event(owner, "owner")["time"] < 1.0
    assert raised["seconds"] > 4, (raised, _event(owner, "owner"))
    # The owner raises its own exception (through Dynamo's backend error).
    assert "failed on purpose" in _event(owner, "raised")["message"]


def test_an_owner_killed_while_compiling_is_named_by_peer_lost_within_5_s(tmp_path):
    (tmp_path / "job").mkdir()
    owner, waiter = _owner_and_waiter(
        run_ranks(tmp_path / "job", 2, PROGRAM, limit=120, env={
            "CCOL_CO_DIR_0": str(tmp_path / "a"), "CCOL_CO_DIR_1": str(tmp_path / "b"),
            "CCOL_CO_PIECES": "1", "CCOL_CO_HOOK": "kill", "CCOL_CO_TIMEOUT": "60"}))
    assert owner.returncode == -9
    raised = _event(waiter, "raised")
    assert raised["cls"] == "PeerLost", raised
    assert raised["missing_ranks"] == [owner.rank]
    assert raised["time"] - _event(owner, "owner")["time"] < 5.0


def test_a_transfer_corrupted_in_flight_is_rejected_and_a_clean_one_loads(tmp_path):
    # Two pieces, each its own directory: rank 0 lowers piece 0 and
    # corrupts its transfer; rank 1 lowers piece 1 and sends it intact.
    ranks = _run(tmp_path, ["a", "b"], CCOL_CO_PIECES=2, CCOL_CO_CORRUPT=0)
    zero, one = (_event(r, "step") for r in ranks)
    assert one["package"]["compile_once_rejected"] == 1, one
    assert one["package"]["compile_once_fell_back"] == 1
    assert "compile_once_received" not in one["package"]
    # Rank 1 lowered both pieces (its own, and the rejected one itself);
    # rank 0 only its own, and loaded what rank 1 sent.
    assert (zero["lowerings"], one["lowerings"]) == (2, 4)
    assert zero["package"]["compile_once_received"] == 1
    assert zero["package"]["compile_once_bytes_received"] == one["package"][
        "compile_once_bytes_sent"] > 0
    assert len(zero["losses"]) == len(one["losses"]) == 2
# The plan, the directory groups and the checks of a peer's manifest: what
# every rank computes alike from the lookup exchange, without processes.


def _plan(keys, loaded, groups, me, index=0):
    from compiler_collectives._compile_once import Plan

    return Plan(keys, loaded, [frozenset(g) for g in groups], me, index)


def test_the_owner_of_each_missed_key_is_the_next_rank_in_turn():
    keys, loaded, groups = ["k"] * 4, [False] * 4, [{0, 1}, {0, 1}, {2, 3}, {2, 3}]
    owners = [_plan(keys, loaded, groups, 0, index).source for index in range(6)]
    assert owners == [0, 1, 2, 3, 0, 1]
    plan = _plan(keys, loaded, groups, 2, 1)
    assert plan.compiling and plan.lowers == [1] and plan.misses == [0, 2, 3]
    # Rank 0 shares rank 1's directory: it reads the files from disk; rank
    # 2 receives them and tells rank 3, which shares its directory.
    assert plan.on_disk == [0] and plan.receivers == {2: [3]}


def test_a_missed_key_is_lowered_by_a_rank_of_the_warmest_cache_directory():
    from compiler_collectives._compile_once import Plan

    # Ranks 0 and 1 share a directory where rank 1's compiles hit Inductor's
    # FX graph cache 3 times; rank 3's own directory, once.
    groups = [frozenset({0, 1}), frozenset({0, 1}), frozenset({2}), frozenset({3})]
    owners = [Plan(["k"] * 4, [False] * 4, groups, 0, index, warmth=[0, 3, 0, 1]).source
              for index in range(4)]
    assert owners == [0, 1, 0, 1]


def test_a_key_some_rank_loaded_is_sent_by_a_rank_that_loaded_it():
    plan = _plan(["k"] * 4, [False, True, False, True], [{r} for r in range(4)], 0, 1)
    assert not plan.compiling and plan.lowers == [] and plan.source == 3
    assert plan.misses == [0, 2] and plan.receivers == {0: [], 2: []}


def test_ranks_whose_keys_differ_plan_apart():
    keys = ["a", "b", "a", ""]
    plan = _plan(keys, [False] * 4, [{0, 1, 2, 3}] * 4, 1)
    assert plan.ranks == [1] and plan.source == 1 and plan.misses == []
    plan = _plan(keys, [False] * 4, [{0, 1, 2, 3}] * 4, 2, 1)
    assert plan.ranks == [0, 2] and plan.source == 2 and plan.on_disk == [0]


def test_directory_groups_come_from_every_ranks_view():
    from compiler_collectives._compile_once import groups_from_views

    groups = groups_from_views([["0,1"], ["1,0"], [""], ["3,x"], ["2,9"]], 5)
    assert groups == [{0, 1}, {0, 1}, {2, 4}, {3}, {2, 4}]
    # Views that are not transitive (rank 0 sees 1, 1 sees 2): one group.
    assert groups_from_views([["1"], ["2"], [""]], 3) == [{0, 1, 2}] * 3


@pytest.mark.parametrize("entry, why", [
    ({"path": "../etc/passwd", "size": 1, "sha256": "0" * 64}, "is not one of"),
    ({"path": "/tmp/x.so", "size": 1, "sha256": "0" * 64}, "is not one of"),
    ({"path": "aotautograd/k/../../x", "size": 1, "sha256": "0" * 64}, "is not one of"),
    ({"path": "ab/cab.py", "size": 1, "sha256": "0" * 64}, "is not one of"),
    ({"path": "ab/cab.main.so", "size": 11, "sha256": "0" * 64}, "not within 0..10"),
    ({"path": "ab/cab.main.so", "size": -1, "sha256": "0" * 64}, "not within 0..10"),
    ({"path": "ab/cab.main.so", "size": True, "sha256": "0" * 64}, "not within 0..10"),
    ({"path": "ab/cab.main.so", "size": 1, "sha256": "0" * 63}, "is not a SHA-256"),
    (["ab/cab.main.so"], "not an object"),
])
def test_a_peers_manifest_entry_is_checked_before_anything_is_written(entry, why):
    from compiler_collectives._shipping import Rejected, check_entry

    with pytest.raises(Rejected, match=why):
        check_entry(entry, 10)


def test_a_peer_ships_only_the_aotautograd_entry_of_the_key_being_shipped():
    from compiler_collectives._shipping import Rejected, check_entry

    entry = {"path": "aotautograd/aother/entry", "size": 1, "sha256": "0" * 64}
    with pytest.raises(Rejected, match="not of the key akey"):
        check_entry(entry, 10, "akey")
    assert check_entry(dict(entry, path="aotautograd/akey/entry"), 10, "akey")[0] == (
        "aotautograd/akey/entry")


def test_what_a_load_needs_passes_the_checks():
    from compiler_collectives._shipping import check_entry

    digest = hashlib.sha256(b"x").hexdigest()
    for path in ("aotautograd/akey/entry", "fxgraph/ab/fabc/entry", "ab/cabc.main.so",
                 "ab/cabc.so"):
        assert check_entry({"path": path, "size": 1, "sha256": digest}, 10) == (path, 1, digest)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"compile_once": 1}, "InvalidArgument", "compile_once must be a bool"),
    ({"compile_once": True, "max_artifact_bytes": 0}, "InvalidArgument", "positive int"),
    ({"compile_once": True, "max_artifact_bytes": 1.5}, "InvalidArgument", "positive int"),
    ({"compile_once": True, "compile_timeout": -1}, "InvalidArgument", "compile_timeout"),
    ({"compile_once": True, "compile_timeout": "60"}, "InvalidArgument", "compile_timeout"),
])
def test_bad_compile_once_arguments_are_refused(world_of_one, kwargs, error, match):
    import compiler_collectives
    import compiler_collectives.torch as cct

    with pytest.raises(getattr(compiler_collectives, error), match=match):
        cct.enable(timeout=30, **kwargs)
    assert not cct.is_enabled()


def test_a_pass_that_bakes_the_rank_in_after_the_key_is_refused(world_of_one):
    import torch._inductor.config as inductor_config

    import compiler_collectives
    import compiler_collectives.torch as cct

    # Not monkeypatch: it deletes what a config module's __dict__ lacks.
    inductor_config.bucket_all_gathers_fx = "all"
    try:
        with pytest.raises(compiler_collectives.Unsupported,
                           match="bucket_all_gathers_fx='all'"):
            cct.enable(timeout=30, compile_once=True)
        assert not cct.is_enabled()
        cct.enable(timeout=30)  # without compile_once it is the user's choice
        cct.disable()
    finally:
        inductor_config.bucket_all_gathers_fx = "none"


def test_compile_once_turns_lazy_backward_lowering_off_until_disable(world_of_one):
    import torch._functorch.config as functorch_config

    import compiler_collectives.torch as cct

    assert functorch_config.force_non_lazy_backward_lowering is False
    cct.enable(timeout=30, compile_once=True, compile_timeout=600)
    try:
        assert functorch_config.force_non_lazy_backward_lowering is True
        info = cct.channel_info()
        assert (info["compile_once"], info["compile_timeout"]) == (True, 600.0)
        assert info["max_artifact_bytes"] == 1 << 30
    finally:
        cct.disable()
    assert functorch_config.force_non_lazy_backward_lowering is False


def test_a_kernel_an_earlier_graph_loaded_is_part_of_what_a_later_graph_needs(
        world_of_one, tmp_path, monkeypatch):
    import torch
    import torch._inductor.config as inductor_config

    import compiler_collectives.torch as cct
    from compiler_collectives._shipping import Record, _Recording, files_of

    # One pointwise kernel over 32 contiguous elements, in two graphs (the
    # shapes differ, the kernel's source does not): the second graph finds
    # it in this process's kernels and never loads its shared object again.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    fn = torch.compile(lambda a: torch.relu(a) * 3, backend="inductor", dynamic=False)
    records = [Record(), Record()]
    cct.enable(timeout=30, compile_once=True)
    try:
        with inductor_config.patch(compile_threads=1):
            for rec, shape in zip(records, [(4, 8), (8, 4)]):
                with _Recording(rec):
                    fn(torch.randn(shape))
    finally:
        cct.disable()
        torch._dynamo.reset()
    first, second = records
    assert len(first.libraries) == 1 and first.libraries == second.libraries, records
    assert first.fx_keys != second.fx_keys
    kernel = files_of(second, str(tmp_path))[-1]
    assert kernel.endswith(".so") and (tmp_path / kernel).is_file()
