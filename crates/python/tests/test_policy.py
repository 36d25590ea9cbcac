"""The agreement policy on real rank processes (docs/python.md, "The
agreement policy"): under the default (exchange="auto", guard_votes="auto")
a job that runs without the package runs with it; graphs that hold
collectives make every rank recompile together; local() makes rank-local
compiled work stand aside. Each case is tests/ranks/policy.py with a CASE."""

from __future__ import annotations

import pytest

from conftest import run_cases, run_ranks


#: The cases that end normally, run in turn in one job (tests/ranks/policy.py):
#: the rank processes start once for all of them.
CASES = ("shorter_last_batch", "rank0_eval", "funcol_shorter", "local_then_shape_change",
         "prior_join", "recompile_limit", "compiled_ddp", "first_compile_in_local",
         "reset_then_shapes_differ")


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    ranks = run_cases(tmp_path_factory, "policy.py", CASES)
    for r in ranks:
        # A job that ends normally prints no notice.
        assert "compiler_collectives: job rank" not in r.stderr, r.stderr[-3000:]
    return ranks


def _done(ranks, case=None):
    """Each rank's "done" event of `case`."""
    out = []
    for r in ranks:
        found = [e for e in r.events if e.get("ev") == "done" and e.get("case") == case]
        assert len(found) == 1, (case, r.events, r.stderr[-3000:])
        out.append(found[0])
    return out


def test_a_shorter_last_batch_on_one_rank_recompiles_there_alone(cases):
    zero, one = _done(cases, "shorter_last_batch")
    # Step 0 exchanged (same shapes: static); rank 0's last batch (5 rows)
    # misses its guards and recompiles alone, with dim 0 dynamic (its own
    # automatic dynamic), as without the package.
    assert zero["compiles"] == [[], [0]], zero
    assert one["compiles"] == [[]], one
    # The enable check and step 0's exchange: the recompile exchanged nothing.
    assert zero["exchanges"] == one["exchanges"] == 2
    assert (zero["local_compiles"], one["local_compiles"]) == (1, 0)
    assert zero["votes_on"] is False and one["votes_on"] is False


def test_rank_zero_evaluating_with_the_compiled_function_runs(cases):
    zero, one = _done(cases, "rank0_eval")
    # no_grad on rank 0: a guard miss there, compiled locally; training goes
    # on with the step-0 graph on both ranks.
    assert zero["compiles"] == [[], []], zero
    assert one["compiles"] == [[]], one
    assert zero["exchanges"] == one["exchanges"] == 2
    assert (zero["local_compiles"], one["local_compiles"]) == (1, 0)


def test_a_graph_holding_collectives_makes_every_rank_recompile_together(cases):
    zero, one = _done(cases, "funcol_shorter")
    # g's first compile holds a functional all-reduce: votes turn on there,
    # on both ranks; rank 0's shorter batch at step 2 is a miss in the vote,
    # and both recompile, exchanged: dim 0 dynamic on both.
    for d in (zero, one):
        assert d["votes_on"] is True, d
        assert d["compiles"] == [[], [0]], d
        assert d["local_compiles"] == 0, d
        # #0 enable, #1 step 0's compile, #2 step 1's vote, #3 step 2's vote,
        # #4 the recompile.
        assert d["exchanges"] == 5, d
    # (8 + 8) * 2 per element at steps 0-1, (5 + 8) * 2 at step 2, 8 elements.
    assert zero["results"] == one["results"] == [256.0, 256.0, 208.0]
    assert zero["code_state_g"] == one["code_state_g"]


def test_local_work_stands_aside_and_later_exchanges_fold_the_same_state(cases):
    zero, one = _done(cases, "local_then_shape_change")
    inside = cases[0].event("local")
    # Inside local(): g's recompile (dim 0 dynamic from rank 0's own code
    # state) and h's first compile, neither exchanged nor voted.
    assert inside["compiles"] == [[], [0], []], inside
    assert inside["code_state_g"] != zero["code_state_g"]
    # Then both ranks call g on 6 rows: rank 0's local entry would hit, rank
    # 1 misses: the vote makes both recompile, exchanged, and the code state
    # (put back on leaving local()) folds the same on both: dim 0 dynamic.
    assert zero["compiles"] == [[], [0], [], [0]], zero
    assert one["compiles"] == [[], [0]], one
    assert zero["code_state_g"] == one["code_state_g"], (zero, one)
    assert "?" in zero["code_state_g"]["L['x']"], zero
    # #0 enable, #1 g's first compile, #2 the vote at 6 rows, #3 the
    # recompile: what rank 0 did inside local() used no exchange.
    assert zero["exchanges"] == one["exchanges"] == 4
    assert zero["local_compiles"] == 2 and one["local_compiles"] == 0
    # g: every rank's (rows * 2) summed, 8 elements; h: (3 * 8) * 2.
    assert zero["results"] == [256.0, 160.0, 48.0, 192.0], zero
    assert one["results"] == [256.0, 160.0, 192.0], one


def test_a_first_compile_on_one_rank_alone_inside_local_runs(cases):
    # Rank 0 alone calls h, compiled but never called on rank 1, inside
    # local(): compiled locally, no exchange (outside local(), the notice
    # test below: a Timeout naming rank 1).
    (done,) = _done(cases[:1], "first_compile_in_local")
    assert done["error"] is None
    assert done["exchanges"] == 2 and done["local_compiles"] == 1, done


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("store", ["filestore", "tcpstore"])
def test_the_peer_of_a_failing_rank_says_why_within_the_deadline(tmp_path, store):
    # Rank 0's first compile of h is alone: a Timeout naming rank 1 at the
    # deadline (3 s). Rank 1 sits in a torch all-reduce that rank 0 never
    # joins; it prints rank 0's notice at once (FileStore: a Python thread;
    # TCPStore: the native watcher on its own connection), before Gloo's
    # error ends the all-reduce.
    env = {"CCOL_POLICY_TIMEOUT": "3"}
    if store == "tcpstore":
        env["CCOL_TEST_TCP_PORT"] = str(_free_port())
    ranks = run_ranks(tmp_path, 2, "notice.py", env=env)
    err = ranks[0].event("error")
    # Outside local(): h's first compile is exchanged and rank 1 never comes.
    assert err["kind"] == "timeout" and err["missing"] == [1], (err, ranks[0].stderr[-3000:])
    assert err["exchange"] == 2
    assert err["key"].startswith("torch.frame __main__:h:") and err["key"].endswith("#0"), err
    assert 3.0 <= err["ended"] - err["began"] <= 4.0, err
    assert "compiler_collectives.torch.local()" in err["message"], err
    # The exchange's own failure event is not printed bare on stderr (the
    # error reached the caller, which emitted it above).
    assert "exchange failed" not in ranks[0].stderr, ranks[0].stderr[-3000:]
    seen = ranks[1].event("collective")
    assert seen["ended_by"] is not None, seen  # the all-reduce failed once rank 0 left
    assert len(seen["notices"]) == 1, (seen, ranks[1].stderr[-3000:])
    at, line = seen["notices"][0]
    assert line.startswith(
        "compiler_collectives: job rank 0 failed: Timeout (timeout) in exchange #2 "
        "'torch.frame __main__:h:"
    ), line
    assert "waiting for rank [1]" in line, line
    # Within the deadline + 1 s of rank 0's exchange.
    assert at - err["began"] <= 3.0 + 1.0, (at, err)
    # Rank 0 wrote it: rank 0 prints no notice of its own.
    assert "compiler_collectives: job rank" not in ranks[0].stderr


def test_an_exchanged_recompile_folds_the_same_state_after_a_local_one(cases):
    zero, one = _done(cases, "prior_join")
    # f: rank 0 recompiled alone (dim 0 dynamic in its code state only);
    # g (an all-reduce) turned votes on; f on a new dim 1 missed on both:
    # one exchanged recompile, each rank sending prior ⊔ observation, so
    # both fold dims 0 and 1 dynamic (without the prior, rank 1 would fold
    # dim 0 static).
    assert zero["compiles"] == [[], [0], [], [0, 1]], zero
    assert one["compiles"] == [[], [], [0, 1]], one
    assert zero["code_state_f"] == one["code_state_f"], (zero, one)
    assert zero["code_state_f"]["L['x']"].startswith("tensor size=[?, ?]"), zero
    # #0 enable, #1 f, #2 g, #3 the vote, #4 f's recompile.
    assert zero["exchanges"] == one["exchanges"] == 5
    assert (zero["local_compiles"], one["local_compiles"]) == (1, 0)


def test_the_recompile_limit_of_an_exchanged_compile_counts_exchanged_compiles(cases):
    zero, one = _done(cases, "recompile_limit")
    # recompile_limit 3: rank 0's two local recompiles left it 3 cache
    # entries for f (Dynamo alone would run its next miss uncompiled, and
    # never join the exchange). The exchanged recompile is f's second
    # exchanged compile on both ranks: both compile it, together.
    assert zero["compiles"] == [[], [0], [0, 1], [], [0, 1]], zero
    assert one["compiles"] == [[], [], [0, 1]], one
    assert zero["results"] == one["results"] == [128.0]
    assert zero["exchanges"] == one["exchanges"] == 5
    assert (zero["local_compiles"], one["local_compiles"]) == (2, 0)


def test_compiled_ddp_with_a_shorter_last_batch_on_one_rank_runs(cases):
    zero, one = _done(cases, "compiled_ddp")
    # Compiled autograd captures each backward on its own rank (its graphs
    # compile locally); the forward's first compile is exchanged. Rank 0's
    # last batch of 2 rows recompiles on rank 0 alone, and the all-reduces
    # in the backward still match: the parameters stay equal on both ranks.
    assert zero["params"] == one["params"], (zero, one)
    assert len(zero["losses"]) == len(one["losses"]) == 4
    # Rank 0: the forward (exchanged), its backward graph (local), the
    # forward's recompile at 2 rows and the backward's recapture (local).
    # Rank 1: the forward and its backward graph.
    assert zero["compiles"] == [[], [], [0], [1]], zero
    assert one["compiles"] == [[], []], one
    assert zero["exchanges"] == one["exchanges"] == 2
    assert (zero["local_compiles"], one["local_compiles"]) == (3, 1)


def test_after_a_reset_each_first_compile_is_exchanged_again(cases):
    zero, one = _done(cases, "reset_then_shapes_differ")
    # torch.compiler.reset() while enabled: f's next compile is a first
    # compile again, exchanged; the ranks' batches differ (8 and 6 rows),
    # so both compile dim 0 dynamic, as a fresh process would.
    assert zero["compiles"] == one["compiles"] == [[], [0]], (zero, one)
    assert zero["exchanges"] == one["exchanges"] == 3
    assert zero["local_compiles"] == one["local_compiles"] == 0
