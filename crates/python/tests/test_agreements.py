"""PT2's other compile-time agreements on the package's channel: AOTAutograd's
cache-hit vote, the partitioner's decision sync, Inductor's distributed
autotuning and the graph checks (docs/python.md, "Every agreement"). Each
case runs real ranks (tests/ranks/) and counts the torch process groups
created and the collectives run on torch groups while Dynamo compiles or
AOTAutograd compiles a backward (tests/ranks/torch_comms.py): none with the
package."""

import json
import math
import shutil

import pytest
import torch
from conftest import run_ranks

import compiler_collectives.torch as cct

#: The deadline of the cache-skew runs, in seconds. Every exchange there
#: comes before any rank compiles a kernel (the cache vote precedes the load,
#: the partitioner's sync the lowering), so the gap it covers is tracing on
#: both ranks: measured 0.1-1.2 s on 2 cores; 60 leaves room for a loaded
#: machine.
SKEW_TIMEOUT_S = 60
#: The deadline of the graph-check runs (aot_eager, no kernel compiles).
GRAPH_TIMEOUT_S = 30


def _skew(tmp_path, run, mode):
    # Each run its own FileStore (a store file keeps the last run's keys);
    # the caches are the test's.
    (tmp_path / run).mkdir()
    return run_ranks(
        tmp_path / run, 2, "cache_skew.py", limit=240,
        env={"CCOL_SKEW_MODE": mode, "TORCHINDUCTOR_CACHE_DIR": f"{tmp_path}/cache-{{rank}}",
             "CCOL_SKEW_TIMEOUT": str(SKEW_TIMEOUT_S), "CCOL_PG_BACKEND": "cpu:gloo"},
    )


def _steps(ranks):
    out = []
    for r in ranks:
        assert r.returncode == 0, r.stderr[-3000:]
        out.append(r.event("step"))
    return out


# Rank r's step: d/dw sum(relu(x @ w) * s), x = ones(4, 4), s = all_reduce(x.sum()) = 32.
GRAD = [[128.0] * 4] * 4


def test_cache_skew_every_rank_compiles(tmp_path):
    """Rank 0's AOTAutograd and FX caches are warm (an earlier run), rank 1's
    cold; the joint graph holds a functional collective and the partitioner's
    sync is on, the backend Inductor on CPU. With the package
    (cache_agreement=True, every version): every rank compiles (rank 0's hit
    is dropped), as torch 2.15 with its own flag does, the gradients are
    right, and no torch group is created and no collective runs on one.

    torch 2.15's own path is not run here: it deadlocks now and then on CPU
    Gloo (its partitioner sync's all_gather_object; docs/python.md, "Every
    agreement"), so the expected outcome is torch's as recorded, not a
    control run. ``CCOL_SKEW_MODE=torch`` runs it by hand."""
    warm = _steps(_skew(tmp_path, "warm", "package"))
    for s in warm:
        assert (s["grad"], s["hits"], s["misses"]) == (GRAD, 0, 1), s
    shutil.rmtree(tmp_path / "cache-1")
    skew = _steps(_skew(tmp_path, "skew", "package"))
    print("\nCACHE SKEW (package): " + json.dumps(skew))
    for s in skew:
        assert (s["grad"], s["hits"], s["misses"], s["bypasses"]) == (GRAD, 0, 1, 0), s
    # Rank 0 hit and dropped it; both voted once, and the partitioner synced
    # in three exchanges (with enable's and the frame's: 6).
    assert [s["dropped"] for s in skew] == [1, 0]
    assert [s["exchanges"] for s in skew] == [6, 6]
    assert [s["torch_comms"] for s in warm + skew] == [[]] * 4


def _graph(tmp_path, case):
    return run_ranks(tmp_path, 2, "graph_check.py", limit=120,
                     env={"CCOL_GRAPH_CASE": case, "CCOL_GRAPH_TIMEOUT": str(GRAPH_TIMEOUT_S)})


def test_a_rank_dependent_graph_is_a_graph_mismatch_on_every_rank(tmp_path):
    ranks = _graph(tmp_path, "rank_dependent")
    raised = []
    for r in ranks:
        assert r.returncode == 0, r.stderr[-3000:]
        raised.append(r.event("raised"))
    print("\nGRAPH MISMATCH: " + raised[0]["message"])
    assert {e["type"] for e in raised} == {"GraphMismatch"}
    assert raised[0]["message"] == raised[1]["message"]
    for e in raised:
        assert e["groups"] == [[0], [1]]
        assert "first difference at op 1:" in e["message"]
        assert "job ranks [0] (5 ops): call_function _operator.add [float32]" in e["message"]
        assert "job ranks [1] (5 ops): call_function _operator.mul [float32]" in e["message"]
        assert e["seconds"] < GRAPH_TIMEOUT_S + 1
        assert e["torch_comms"] == []
        # enable's check is #0 and the frame's exchange #1; the fingerprints'
        # digests #2 (where the mismatch is found) and their ops #3.
        assert (e["exchange"], e["last_completed"]) == (2, 3)
        assert e["key"].startswith("torch.graph_check torch.frame "), e["key"]


def test_uneven_shards_are_no_graph_mismatch(tmp_path):
    """Rank r holds a shard of 3 - r rows (FSDP2's uneven shards): the
    fingerprint leaves out the shapes of what no collective takes, so three
    steps run with one check, and the sums are right."""
    ranks = _graph(tmp_path, "uneven")
    for r in ranks:
        assert r.returncode == 0, r.stderr[-3000:]
        done = r.event("done")
        # sum over ranks of 2 * (3 - r) * 4 + 2 * s: 40 + 4 s.
        assert done["out"] == [40.0, 44.0, 48.0]
        # #0 enable, #1 the frame, #2 the graph check; the graph holds an
        # all-reduce, so guard votes are on from then: #3 and #4 steps 1-2.
        assert (done["exchanges"], done["torch_comms"]) == (5, [])


def test_partitioner_sync_keeps_each_ranks_decision_when_the_joint_graphs_differ(tmp_path):
    ranks = _graph(tmp_path, "partitioner_differs")
    for r, d_y in zip(ranks, (math.cos(1.0), -math.sin(1.0))):
        assert r.returncode == 0, r.stderr[-3000:]
        done = r.event("done")
        assert done["grad"] == pytest.approx([d_y * 8] * 4)
        assert ("partitioner decision sync skipped: the joint graphs differ (ranks by graph: "
                "[[0], [1]]); each rank keeps its own saved values") in done["records"]
        assert done["torch_comms"] == []


@pytest.mark.parametrize("mode", ["warn", "error"])
def test_inductors_spmd_check_runs_on_the_channel(tmp_path, mode):
    """Inductor's SPMD check (post-grad, before its reordering passes) with
    a rank-dependent graph: its hashes cross the channel, not the default
    group; "warn" logs PyTorch's report on every rank and the step goes on,
    "error" is a GraphMismatch on every rank naming the groups."""
    ranks = run_ranks(tmp_path, 2, "graph_check.py", limit=240,
                      env={"CCOL_GRAPH_CASE": "spmd", "CCOL_SPMD_MISMATCH": mode,
                           "CCOL_GRAPH_TIMEOUT": str(SKEW_TIMEOUT_S),
                           "TORCHINDUCTOR_CACHE_DIR": f"{tmp_path}/cache-{{rank}}"})
    for r in ranks:
        assert r.returncode == 0, r.stderr[-3000:]
        assert "SPMD GRAPH MISMATCH" in r.stdout, r.stdout[-3000:]
        if mode == "warn":
            done = r.event("done")
            # 2 on each rank (1 + 1 on rank 0, 1 * 2 on rank 1), summed.
            assert (done["out"], done["reported"], done["torch_comms"]) == ([4.0] * 4, True, [])
        else:
            raised = r.event("raised")
            assert (raised["type"], raised["groups"], raised["torch_comms"]) == (
                "GraphMismatch", [[0], [1]], [])
            assert (raised["key"], raised["last_completed"] - raised["exchange"]) == (
                "torch.inductor.spmd_check", 1)
            assert "Inductor's SPMD check: the ranks' post-grad graphs differ" in raised["message"]


@pytest.mark.parametrize("case", ["equal", "differ"])
def test_autotuning_sync_on_the_channel(tmp_path, case):
    ranks = run_ranks(tmp_path, 2, "autotune_sync.py", limit=120,
                      env={"CCOL_AUTOTUNE_CASE": case})
    events = []
    for r in ranks:
        assert r.returncode == 0, r.stderr[-3000:]
        events.append(r.event("sync"))
    assert [e["group"] for e in events] == [[0, 2], [1, 2]]
    assert [e["tags"] for e in events] == [[], []]
    if case == "equal":
        expected = [
            [k, "torch._inductor.kernel.mm.mm_template" if k % 2
             else "torch._inductor.kernel.mm.aten_mm",
             {"ACC_TYPE": "'tl.float32'", "BLOCK_M": 16 * (k + 1), "EVEN_K": k % 2 == 0},
             "_SerializedChoice"]
            for k in range(5)
        ]
        assert [e["winners"] for e in events] == [expected, expected]
    else:
        assert [e["error"] for e in events] == ["Disagreement", "Disagreement"]
        assert events[0]["message"] == events[1]["message"]
        assert "size=[24, 16]" in events[0]["message"]
        assert "size=[24, 32]" in events[0]["message"]
        # The exchange after enable's check (#0).
        assert [(e["key"], e["exchange"]) for e in events] == [
            ("torch.inductor.distributed_autotune", 1)] * 2


def test_agreement_switches_are_checked(world_of_one, monkeypatch, caplog):
    import compiler_collectives
    import torch._inductor.config as inductor_config

    with pytest.raises(compiler_collectives.InvalidArgument, match="cache_agreement"):
        cct.enable(cache_agreement="yes")
    with pytest.raises(compiler_collectives.InvalidArgument, match="check_graphs"):
        cct.enable(check_graphs=1)
    with inductor_config.patch({"aten_distributed_optimizations.spmd_check": True}):
        with pytest.raises(compiler_collectives.Unsupported, match="cache_agreement=True"):
            cct.enable(timeout=20)
        assert not cct.is_enabled()
        # With Inductor's FX graph cache on (its default), a warning: a rank whose
        # FX graph cache hits skips the post-grad check (a Timeout for the others,
        # measured under cache skew on 2.15.0).
        for fx_cache in (True, False):
            caplog.clear()
            with inductor_config.patch({"fx_graph_cache": fx_cache}):
                cct.enable(timeout=20, cache_agreement=True)
            try:
                info = cct.channel_info()
                assert (info["cache_agreement"], info["check_graphs"]) == (True, False)
            finally:
                cct.disable()
            warned = [r.getMessage() for r in caplog.records
                      if "FX graph cache hits skips the post-grad passes" in r.getMessage()]
            assert len(warned) == (1 if fx_cache else 0), warned
    assert torch is not None


def test_a_peer_lost_in_the_cache_vote_is_raised_not_a_bypass(tmp_path):
    """Rank 1 exits in its cache lookup, just before its vote. On 2.13 and
    2.14 rank 0's vote runs inside try_load's ``except Exception`` (a
    bypass); the package keeps the error and raises it: rank 0 gets
    ``PeerLost`` naming rank 1 from the vote itself, and does not go on
    compiling."""
    ranks = run_ranks(
        tmp_path, 2, "cache_skew.py", limit=120,
        env={"CCOL_SKEW_MODE": "package_dies", "TORCHINDUCTOR_CACHE_DIR": f"{tmp_path}/cache-{{rank}}",
             "CCOL_SKEW_TIMEOUT": str(SKEW_TIMEOUT_S), "CCOL_PG_BACKEND": "cpu:gloo"},
    )
    assert ranks[1].returncode == 3, ranks[1].stderr[-3000:]
    assert ranks[0].returncode == 0, ranks[0].stderr[-3000:]
    raised = ranks[0].event("raised")
    print(f"\nVOTE PEER LOST: {raised}")
    assert (raised["type"], raised["key"], raised["missing"]) == (
        "PeerLost", "torch.aot_autograd_cache_hit", [1]), raised
    assert raised["seconds"] < SKEW_TIMEOUT_S


def test_fsdp2_uneven_shards_are_no_graph_mismatch(tmp_path):
    """FSDP2 (fully_shard) on a CPU Gloo mesh, uneven shards, four steps under
    check_graphs=True: no error, the same losses on both ranks, falling, and
    no torch comms inside the compiles."""
    ranks = run_ranks(tmp_path, 2, "fsdp_check.py", limit=180,
                      env={"CCOL_GRAPH_TIMEOUT": str(GRAPH_TIMEOUT_S)})
    done = []
    for r in ranks:
        assert r.returncode == 0, r.stderr[-3000:]
        done.append(r.event("done"))
    print(f"\nFSDP2: {done}")
    assert done[0]["losses"] == done[1]["losses"]
    losses = done[0]["losses"]
    assert len(losses) == 4 and losses[-1] < losses[0]
    # The shards differ (rank 0 holds 3 rows of the first weight, rank 1 two).
    assert [3, 8] in done[0]["shards"] and [2, 8] in done[1]["shards"]
    assert [d["torch_comms"] for d in done] == [[], []]
    assert done[0]["exchanges"] == done[1]["exchanges"] > 2


def test_an_autotuning_winner_from_a_peer_is_read_strictly():
    import compiler_collectives
    from compiler_collectives import _autotune

    class Choice:
        pass

    good = json.dumps({"index": 3, "template_uid": "t", "kwargs": {"A": 1, "B": "x", "C": True}})
    c = _autotune.decode_choice(Choice, good, rank=5)
    assert (type(c), c.index, c.template_uid, c.kwargs) == (
        Choice, 3, "t", {"A": 1, "B": "x", "C": True})
    for bad, why in [
        ("{", "is not JSON"),
        ("[]", "is not {index, template_uid, kwargs}"),
        (json.dumps({"index": 1, "template_uid": "t"}), "is not {index, template_uid, kwargs}"),
        (json.dumps({"index": True, "template_uid": "t", "kwargs": {}}), "has no op index"),
        (json.dumps({"index": -1, "template_uid": "t", "kwargs": {}}), "has no op index"),
        (json.dumps({"index": 1, "template_uid": 2, "kwargs": {}}), "has no template uid"),
        (json.dumps({"index": 1, "template_uid": "t", "kwargs": {"A": [1]}}),
         "has a keyword argument that is not an int, a string or a bool"),
    ]:
        with pytest.raises(compiler_collectives.DecodeError) as e:
            _autotune.decode_choice(Choice, bad, rank=5)
        assert str(e.value).startswith(f"job rank 5 sent an autotuning winner that {why}"), e.value


def test_a_graph_mismatch_names_the_groups_and_the_first_differing_op():
    from compiler_collectives import _graph_check

    a = ["placeholder  [float32]", "call_function torch.add [float32]", "output output []"]
    b = a[:1] + ["call_function torch.mul [float32]"] + a[2:]
    text = _graph_check.mismatch_message("K", [a, b, a, a[:1]], [4, 5, 6, 7])
    assert text == (
        "the ranks traced different graphs for K: 3 graphs; first difference at op 1:\n"
        "  job ranks [4, 6] (3 ops): call_function torch.add [float32]; output output []\n"
        "  job ranks [5] (3 ops): call_function torch.mul [float32]; output output []\n"
        "  job ranks [7] (1 ops): <the graph ends here>"
    )


def test_the_fingerprint_leaves_out_sizes_and_keeps_collective_shapes():
    """A graph with a size input (a shard dim that got a symbol on one rank)
    and one without (the other rank's dim of size 1, specialized) have the
    same fingerprint; a collective's input shape is in it."""
    import torch.fx as fx

    from compiler_collectives import _graph_check

    def graph(with_size, rows):
        g = fx.Graph()
        x = g.placeholder("x")
        x.meta["example_value"] = torch.ones(rows, 4)
        if with_size:
            s = g.placeholder("s0")
            s.meta["example_value"] = 3
            n = g.call_function(torch.mul, (x, s))
        else:
            n = g.call_function(torch.mul, (x, 2))
        n.meta["example_value"] = torch.ones(rows, 4)
        r = g.call_function(torch.ops._c10d_functional.all_reduce.default, (n, "sum", "0"))
        r.meta["example_value"] = torch.ones(rows, 4)
        g.output(r)
        return fx.GraphModule(torch.nn.Module(), g)

    sized = _graph_check.fingerprint(graph(True, 2))
    assert sized == _graph_check.fingerprint(graph(False, 2))
    assert sized == [
        "placeholder  [float32]",
        "call_function torch.mul [float32]",
        "call_function torch.ops._c10d_functional.all_reduce.default [float32] inputs (2, 4)",
        "output output []",
    ]
    assert _graph_check.fingerprint(graph(False, 3))[2].endswith("inputs (3, 4)")
