"""Sharded compilation (docs/python.md, "Sharded compilation"): with
``compile_once`` and ``shard_kernels`` every rank lowers a graph no rank
had, and each of its C++ kernels is built by one rank and sent to the
others. Real ranks, each its own cache directory (a "node" of one rank),
Inductor on CPU with ``compile_threads=2`` (tests/ranks/compile_once.py)."""

from __future__ import annotations

import pytest

from conftest import event_of as _event
from conftest import run_compile_once, run_ranks


def _run(tmp_path, check=True, **env):
    """Two ranks of tests/ranks/compile_once.py with ``shard_kernels``, each
    its own Inductor cache directory."""
    return run_compile_once(tmp_path, ["a", "b"], check=check, CCOL_CO_MODE="shard",
                            TORCHINDUCTOR_COMPILE_THREADS=2, **env)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("sharded"), CCOL_CO_PIECES=1, CCOL_CO_LOG="INFO")


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """The same job, rank 0 corrupting every transfer it sends, and rank 1's
    kernel list of the second round (the backward graph) reading as another
    graph's."""
    return _run(tmp_path_factory.mktemp("faulty"), CCOL_CO_PIECES=1, CCOL_CO_CORRUPT=0,
                CCOL_CO_LIST_DIFFERS="1:2", CCOL_CO_LOG="INFO")


def test_every_rank_lowers_and_each_kernel_is_built_once_in_the_job(sharded):
    zero, one = (_event(r, "step") for r in sharded)
    # The forward and the backward, on each rank.
    assert (zero["lowerings"], one["lowerings"]) == (2, 2)
    built = [set(s["builds"]) for s in (zero, one)]
    assert len(zero["builds"]) == len(built[0]) and len(one["builds"]) == len(built[1])
    # Every rank builds a share; no kernel is built twice.
    assert built[0] and built[1] and not built[0] & built[1], built
    for mine, other, s in ((built[0], built[1], zero), (built[1], built[0], one)):
        package = s["package"]
        assert package["shard_kernels_built"] == len(mine), package
        assert package["shard_kernels_received"] == len(other), package
        assert package["shard_kernels_bytes_received"] > 0
        assert package["compile_once_compiled"] == 1
    assert "lowering on every rank" in sharded[0].stderr
    # The bytes one rank sent are those the other received.
    assert zero["package"]["shard_kernels_bytes_sent"] == \
        one["package"]["shard_kernels_bytes_received"]
    assert one["package"]["shard_kernels_bytes_sent"] == \
        zero["package"]["shard_kernels_bytes_received"]
    # Each rank sums up its sharded compile once it ends.
    for r, mine, other in ((sharded[0], built[0], built[1]), (sharded[1], built[1], built[0])):
        assert (f"{len(mine)} kernel(s) built here, {len(other)} received, 0 built here after "
                "a transfer failed, in 2 round(s)") in r.stderr, r.stderr[-2000:]


def test_a_corrupted_kernel_is_rejected_and_built_by_its_receiver(sharded, faulty):
    zero, one = (_event(r, "step") for r in faulty)
    # The first round: rank 1 rejects what rank 0 built, and builds it.
    assert one["package"]["shard_kernels_rejected"] == 1, one
    fell_back = one["package"]["shard_kernels_fell_back"]
    assert fell_back >= 1
    assert "rejected the files of kernels" in faulty[1].stderr
    assert set(zero["builds"]) <= set(one["builds"])
    # Losses as where every kernel came as it was built.
    assert [zero["losses"], one["losses"]] == [_event(r, "step")["losses"] for r in sharded]


def test_ranks_whose_kernel_lists_differ_build_their_own(sharded, faulty):
    zero, one = (_event(r, "step") for r in faulty)
    for s in (zero, one):
        assert s["package"]["shard_kernels_lists_differ"] == 1, s
    assert "each group builds its own: job ranks [0]; job ranks [1]" in faulty[0].stderr
    # Rank 1 built every kernel: the first round's it rejected or owned, and
    # the whole second round's; rank 0 the second round's too.
    every = set(_event(sharded[0], "step")["builds"]) | set(_event(sharded[1], "step")["builds"])
    assert set(one["builds"]) == every and len(one["builds"]) == len(every), (one, every)
    assert set(zero["builds"]) <= every


def test_a_kernel_build_that_raises_reaches_every_rank_naming_the_kernel_and_its_builder(
        tmp_path):
    zero, one = _run(tmp_path, CCOL_CO_PIECES=1, CCOL_CO_HOOK="build_raise")
    owner = _event(zero, "owner")
    assert "failed on purpose" in _event(zero, "raised")["message"]
    raised = _event(one, "raised")
    assert raised["cls"] == "PeerCompileFailed", raised
    assert raised["owner"] == 0 and raised["exc_type"] == "builtins.RuntimeError"
    assert raised["exc_message"] == "the kernel build failed on purpose (job rank 0)"
    assert f"kernel {owner['kernel']}" in raised["message"]


def test_a_rank_killed_while_building_is_named_by_peer_lost_within_5_s(tmp_path):
    zero, one = _run(tmp_path, check=False, CCOL_CO_PIECES=1, CCOL_CO_HOOK="build_kill")
    assert zero.returncode == -9
    raised = _event(one, "raised")
    assert raised["cls"] == "PeerLost" and raised["missing_ranks"] == [0], raised
    assert raised["time"] - _event(zero, "owner")["time"] < 5.0


# Triton kernels, on CPU: a round of Triton kernels with a stand-in for
# Triton's compile (tests/ranks/shard_triton.py); scripts/gpu-check.sh runs
# the real one.


def _triton(tmp_path, **env):
    full = {f"CCOL_ST_DIR_{r}": str(tmp_path / d) for r, d in enumerate("ab")}
    full.update({k: str(v) for k, v in env.items()})
    ranks = run_ranks(tmp_path, 2, "shard_triton.py", env=full, limit=120)
    for r in ranks:
        assert r.returncode == 0, r.stderr[-3000:]
    return [_event(r, "round") for r in ranks], ranks


TRITON_KERNELS = {f"triton_poi_{i}" for i in range(6)}


def test_triton_kernels_are_built_once_and_a_slower_ranks_share_is_taken_over(tmp_path):
    # Rank 1's builds take 3 s each.
    (zero, one), _ = _triton(tmp_path, CCOL_ST_SLOW=1, CCOL_ST_SLOW_S=3)
    # Each rank's sources name its own device (cuda:0, cuda:1): the round
    # names them alike, so every kernel is held and shared.
    assert set(zero["held"]) == set(one["held"]) == TRITON_KERNELS
    built = [set(zero["builds"]) - {"triton_tune_0"}, set(one["builds"]) - {"triton_tune_0"}]
    assert "triton_tune_0" in zero["builds"] and "triton_tune_0" in one["builds"]
    assert built[0] and built[1] and not built[0] & built[1], built
    assert built[0] | built[1] == TRITON_KERNELS
    # The shares, the costliest (longest source) first: rank 0's 5, 2, 1
    # and rank 1's 4, 3, 0. While rank 1 builds its first, rank 0 builds
    # its own and takes over rank 1's others from the end.
    assert built[1] == {"triton_poi_4"}, built
    assert zero["package"]["shard_kernels_taken_over"] == 2, zero
    assert one["package"].get("shard_kernels_taken_over", 0) == 0, one
    # The other rank's kernels are hits of this rank's Triton cache: the
    # entries arrived, their JSON files naming this rank's directory (the
    # stand-in checks it).
    assert set(zero["hits"]) == built[1] and set(one["hits"]) == built[0]
    # Inductor's wait left every kernel in the module's scope, alike.
    assert zero["scope"] == one["scope"] and set(zero["scope"]) == TRITON_KERNELS
    # Inductor's early submission built nothing; an autotuning caller got
    # its kernel at once, built on each rank as without the package.
    for s in (zero, one):
        assert s["early"] is None and s["tuned"]["name"] == "triton_tune_0", s
    for mine, other, s in ((built[0], built[1], zero), (built[1], built[0], one)):
        assert s["package"]["shard_kernels_built"] == len(mine), s
        assert s["package"]["shard_kernels_received"] == len(other), s
        assert s["package"]["shard_kernels_bytes_received"] > 0, s


def test_a_triton_entry_that_fails_its_digest_is_built_by_its_receiver(tmp_path):
    # Rank 0 corrupts what it sends; rank 1 holds the first kernel in memory
    # already (so rank 0, the only rank needing it, builds it and sends it
    # to nobody).
    (zero, one), ranks = _triton(tmp_path, CCOL_ST_CORRUPT=0, CCOL_ST_HELD=1)
    assert set(zero["held"]) == TRITON_KERNELS
    assert set(one["held"]) == TRITON_KERNELS - {"triton_poi_0"}
    held = [set(zero["builds"]) - {"triton_tune_0"}, set(one["builds"]) - {"triton_tune_0"}]
    assert "triton_poi_0" in held[0] and "triton_poi_0" not in held[1]
    sent = held[0] - {"triton_poi_0"}
    assert sent, zero
    # Rank 1 rejected rank 0's entries and built those kernels itself.
    assert one["package"]["shard_kernels_rejected"] == 1, one
    assert one["package"]["shard_kernels_fell_back"] == len(sent), one
    assert sent <= held[1] and not sent & set(one["hits"])
    assert "rejected the files of kernels" in ranks[1].stderr
    # Rank 0 loaded rank 1's kernels from the entries it received.
    assert set(zero["hits"]) == held[1] - sent
    assert zero["scope"] == one["scope"]


def test_a_triton_kernels_key_leaves_out_the_device_index_only():
    from compiler_collectives._shard import triton_key

    src = ("triton_meta={{'device': DeviceProperties(type='cuda', index={i}, cc=90)}}\n"
           "def triton_poi_0(in_ptr0): x = {x}\n")
    assert triton_key(src.format(i=0, x=1)) == triton_key(src.format(i=7, x=1))
    assert triton_key(src.format(i=0, x=1)) != triton_key(src.format(i=0, x=2))
    assert triton_key(src.format(i=0, x=1)).startswith("triton_")


def test_a_triton_kernel_is_built_by_a_rank_needing_it_and_sent_to_each_other_one():
    from compiler_collectives._shard import assign

    t = "triton_" + "a" * 40
    # Rank 0 holds t in memory (it does not need it); ranks 1 to 3 do, and
    # ranks 2 and 3 share an Inductor cache directory: Triton's directory is
    # one per device, so each receives it.
    needs = {0: {}, 1: {t: [9, []]}, 2: {t: [9, []]}, 3: {t: [9, []]}}
    groups = [frozenset({0}), frozenset({1}), frozenset({2, 3}), frozenset({2, 3})]
    source, transfers = assign(needs, [0, 1, 2, 3], groups)
    assert source == {t: 1}
    assert transfers == [(1, 2, [t]), (1, 3, [t])]


@pytest.mark.parametrize("compile_timeout", [2.0, None])
def test_a_rounds_exchanges_wait_compile_timeout_not_the_channels_timeout(compile_timeout):
    # A new user's trial found compile_timeout=15 ignored under timeout=300:
    # a stopped peer held the others for the channel's timeout, or an hour.
    from types import SimpleNamespace

    from compiler_collectives._shard import DEFAULT_WAIT_S, Sharding

    waits = []

    def gather_texts(key, texts, timeout_s=None):
        waits.append(timeout_s)
        return [texts]

    st = SimpleNamespace(compile_timeout=compile_timeout, ranks=None,
                         channel=SimpleNamespace(timeout_s=300.0, gather_texts=gather_texts))
    Sharding(st, "k", [frozenset({0})])._gather(["r"])
    assert waits == [DEFAULT_WAIT_S if compile_timeout is None else compile_timeout]


# The plan of a round: what every rank computes alike from the round's
# first exchange.


def test_kernels_spread_over_the_ranks_by_cost_the_costliest_first():
    from compiler_collectives._shard import assign

    needs = {r: {"k1": [90, ["k1/ck1.main.so"]], "k2": [50, ["k2/ck2.main.so"]],
                 "k3": [40, ["k3/ck3.main.so"]], "k4": [10, ["k4/ck4.main.so"]]}
             for r in range(2)}
    source, transfers = assign(needs, [0, 1], [frozenset({0}), frozenset({1})])
    # 90 to rank 0; 50 and 40 to rank 1 (then 90 against 90); 10 to rank 0.
    assert source == {"k1": 0, "k2": 1, "k3": 1, "k4": 0}
    assert transfers == [(0, 1, ["k1", "k4"]), (1, 0, ["k2", "k3"])]
    # What each rank built in earlier rounds counts: rank 0 built 100.
    source, _ = assign(needs, [0, 1], [frozenset({0}), frozenset({1})], {0: 100, 1: 0})
    assert source == {"k1": 1, "k2": 1, "k3": 0, "k4": 0}


def test_a_share_is_what_a_rank_builds_and_each_kernel_comes_from_whoever_built_it():
    from compiler_collectives._shard_plan import assign, plan_transfers, settle, shares

    needs = {r: {"k1": [90, ["k1/ck1.main.so"]], "k2": [50, ["k2/ck2.main.so"]],
                 "k3": [40, ["k3/ck3.main.so"]], "k4": [10, ["k4/ck4.main.so"]]}
             for r in range(2)}
    groups = [frozenset({0}), frozenset({1})]
    source, _ = assign(needs, [0, 1], groups)
    assert shares(source, needs, [0, 1]) == {0: ["k1", "k4"], 1: ["k2", "k3"]}
    # Rank 0 took k3 over: it comes from rank 0.
    final, left, unbuilt = settle(source, needs, {0: {"k1", "k3", "k4"}, 1: {"k2"}}, [0, 1])
    assert final == {"k1": 0, "k2": 1, "k3": 0, "k4": 0} and not unbuilt
    assert plan_transfers(final, left, [0, 1], groups) == [(0, 1, ["k1", "k3", "k4"]),
                                                           (1, 0, ["k2"])]
    # k2 built twice (a claim the store could not take): it comes from its
    # planned builder, and no rank receives what it built itself.
    final, left, _ = settle(source, needs, {0: {"k1", "k2", "k4"}, 1: {"k2", "k3"}}, [0, 1])
    assert final["k2"] == 1 and "k2" not in left[0] and "k2" not in left[1]
    assert plan_transfers(final, left, [0, 1], groups) == [(0, 1, ["k1", "k4"]),
                                                           (1, 0, ["k3"])]
    # No rank built k4: nobody sends it, and each rank builds it as it loads.
    final, left, unbuilt = settle(source, needs, {0: {"k1"}, 1: {"k2", "k3"}}, [0, 1])
    assert unbuilt == {"k4"} and "k4" not in final and "k4" not in left[0] | left[1]
    # A holder builds nothing and stays the source.
    held = {0: {}, 1: {"k": [5, ["ab/cabc.main.so"]]}}
    source, _ = assign(held, [0, 1], groups)
    assert shares(source, held, [0, 1]) == {0: [], 1: []}
    assert settle(source, held, {0: set(), 1: set()}, [0, 1])[0] == {"k": 0}


class _Store:
    """c10d's ``add``: the key's new value."""

    def __init__(self) -> None:
        self.values: dict = {}

    def add(self, key, n):
        self.values[key] = self.values.get(key, 0) + n
        return self.values[key]

    def delete_key(self, key):
        return self.values.pop(key, None) is not None


def _sharding(store):
    from types import SimpleNamespace

    from compiler_collectives._shard import Sharding

    st = SimpleNamespace(compile_timeout=None, ranks=None, store=store,
                         channel=SimpleNamespace(rank=0))
    sharding = Sharding(st, "k", [frozenset({0}), frozenset({1})])
    sharding._build = lambda kernels: (list(kernels), None)
    return sharding


def test_a_rank_claims_its_share_then_takes_the_others_over_from_their_ends():
    from compiler_collectives._shard import Kernel

    mine = {k: Kernel(k, None, [], 1) for k in "abcdef"}
    store = _Store()
    # Rank 1 claimed the first two of its share.
    store.add("s/c", 1)
    store.add("s/d", 1)
    sharding = _sharding(store)
    built, taken, failure = sharding._build_claimed({0: ["a", "b"], 1: list("cdef")}, mine, "s")
    assert [k.key for k in built] == taken == ["a", "b", "f", "e"] and failure is None
    # Past the round's second exchange, a rank deletes its own claims.
    sharding._release("s", taken)
    assert set(store.values) == {"s/c", "s/d"}
    # An owner's first kernel is never taken: every rank builds a share.
    store = _Store()
    built, _, _ = _sharding(store)._build_claimed({0: [], 1: list("cdef")}, mine, "s")
    assert [k.key for k in built] == ["f", "e", "d"]
    # A kernel of another's share this rank does not hold (a Triton kernel
    # it has in memory) is passed over, not claimed.
    built, _, _ = _sharding(_Store())._build_claimed({0: [], 1: ["c", "x", "d"]}, mine, "s")
    assert [k.key for k in built] == ["d"]


def test_a_store_that_cannot_claim_leaves_each_rank_its_own_share(caplog):
    from compiler_collectives._shard import Kernel

    class Broken:
        def add(self, key, n):
            raise RuntimeError("the store is gone")

    mine = {k: Kernel(k, None, [], 1) for k in "abcd"}
    sharding = _sharding(Broken())
    with caplog.at_level("WARNING", logger="compiler_collectives"):
        built, taken, _ = sharding._build_claimed({0: ["a", "b"], 1: ["c", "d"]}, mine, "s")
    assert [k.key for k in built] == ["a", "b"] and taken == [] and not sharding.claiming
    assert "cannot claim kernels through the job's store (RuntimeError: the store is gone)" \
        in caplog.text


def test_a_kernel_some_rank_has_is_sent_by_it_once_per_directory():
    from compiler_collectives._shard import assign

    # Ranks 0 and 1 share a directory that has k; ranks 2 and 3 share
    # another that lacks it: rank 0 sends it to rank 2 alone.
    k = ["ab/cabc.main.so"]
    needs = {0: {}, 1: {}, 2: {"k": [5, k]}, 3: {"k": [5, k]}}
    groups = [frozenset({0, 1}), frozenset({0, 1}), frozenset({2, 3}), frozenset({2, 3})]
    source, transfers = assign(needs, [0, 1, 2, 3], groups)
    assert source == {"k": 0} and transfers == [(0, 2, ["k"])]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"shard_kernels": 1}, "InvalidArgument", "shard_kernels must be a bool"),
    ({"shard_kernels": True}, "InvalidArgument", "needs compile_once=True"),
])
def test_bad_shard_kernels_arguments_are_refused(world_of_one, kwargs, error, match):
    import compiler_collectives
    import compiler_collectives.torch as cct

    with pytest.raises(getattr(compiler_collectives, error), match=match):
        cct.enable(timeout=30, **kwargs)
    assert not cct.is_enabled()


def test_shard_kernels_needs_a_pool_of_compile_threads(world_of_one):
    import torch._inductor.config as inductor_config

    import compiler_collectives
    import compiler_collectives.torch as cct

    with inductor_config.patch(compile_threads=1):
        with pytest.raises(compiler_collectives.Unsupported, match="compile_threads is 1"):
            cct.enable(timeout=30, compile_once=True, shard_kernels=True)
    assert not cct.is_enabled()
    with inductor_config.patch(compile_threads=2):
        cct.enable(timeout=30, compile_once=True, shard_kernels=True)
        try:
            assert cct.channel_info()["shard_kernels"] is True
        finally:
            cct.disable()
