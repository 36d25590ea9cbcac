"""compiler_collectives.torch on real rank processes: decisions, errors a
caller can catch, deadlines, guard votes, torchrun's error file. Each case's
rank program is a file of tests/ranks/ (the harness: conftest.py)."""

from __future__ import annotations

import json

import pytest

from conftest import run_ranks


def test_ranks_agree_on_dynamic_dims_without_torch_collectives(tmp_path):
    # docs/scenarios.md scenario 1: x = (s, 8), s = 5,8,6 on rank 0 and
    # 6,6,3 on rank 1: with the exchange, one compile each, dim 0 dynamic.
    ranks = run_ranks(tmp_path, 2, "agree_without_torch_collectives.py")
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
    ranks = run_ranks(tmp_path, 2, "desync_frames.py")
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
        assert "desync_frames" not in done["message"]  # the program's file


def test_ranks_with_different_dynamo_config_disagree_at_enable(tmp_path):
    for r in run_ranks(tmp_path, 2, "config_disagreement.py"):
        done = r.event("done")
        assert done["error"] == "disagreement", (done, r.stderr[-3000:])
        assert "recompile_limit=8" in done["message"] and "recompile_limit=4" in done["message"]
        # The enable check is exchange #0 (a new user's attack found None).
        assert (done["exchange"], done["key"], done["last_completed"]) == (0, "torch.enable", None)
        # A refused enable changes nothing.
        assert done["enabled"] is False
        assert done["flag"] is False


def test_a_rank_waiting_alone_times_out_naming_the_other_within_the_deadline(tmp_path):
    # Rank 1 is alive but never compiles again (sleeping); rank 0 recompiles
    # and waits alone: a Timeout naming rank 1 within the deadline + 1 s.
    ranks = run_ranks(tmp_path, 2, "waiting_alone_times_out.py")
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
    ranks = run_ranks(tmp_path, 2, "failed_guard_vote.py")
    assert ranks[0].returncode == 0, ranks[0].stderr[-3000:]
    done = ranks[0].event("done")
    assert done["kind"] == "peer_lost", done
    assert done["missing"] == [1]
    # #0 the enable check, #1 the compile; the vote of step 1 is #2.
    assert done["exchange"] == 2


def test_suppress_errors_does_not_turn_our_error_into_an_eager_fallback(tmp_path):
    ranks = run_ranks(tmp_path, 2, "suppress_errors.py")
    done = ranks[0].event("done")
    assert done["error"] == "peer_lost", (done, ranks[0].stderr[-3000:])
    assert done["missing"] == [1]


def test_an_error_reaching_the_caller_is_written_to_the_torchelastic_error_file(tmp_path):
    ranks = run_ranks(
        tmp_path, 2, "error_file.py", env={"TORCHELASTIC_ERROR_FILE": "{tmp}/error-{rank}.json"}
    )
    assert ranks[0].returncode == 1
    assert "compiler_collectives.PeerLost: lost rank [1]" in ranks[0].stderr
    data = json.loads((tmp_path / "error-0.json").read_text())
    assert data["message"]["message"].startswith("PeerLost: lost rank [1]"), data
    assert "Traceback" in data["message"]["extraInfo"]["py_callstack"]
    assert int(data["message"]["extraInfo"]["timestamp"]) > 0
    assert ranks[1].returncode == 0
    assert not (tmp_path / "error-1.json").exists()


def test_guard_votes_make_every_rank_recompile_when_one_misses(tmp_path):
    # docs/scenarios.md scenario 8 with collectives off and votes on: rank 1
    # misses alone at step 1; both recompile.
    ranks = run_ranks(tmp_path, 2, "guard_votes_recompile.py")
    assert ranks[0].event("done")["compiles"] == [[], []]
    assert ranks[1].event("done")["compiles"] == [[], [0]]


def test_a_rank_waiting_in_an_exchange_lets_its_other_threads_run(tmp_path):
    # The wait releases the GIL: a thread of the waiting rank keeps counting
    # while rank 1 arrives two seconds late.
    ranks = run_ranks(tmp_path, 2, "wait_releases_gil.py")
    done = ranks[0].event("done")
    assert done["waited"] >= 1.5, done
    # About 100 ticks a second while rank 0 waited; with the GIL held, none.
    assert done["during"] >= 50 * done["waited"], done


def test_compiles_in_another_thread_exchange_too(tmp_path):
    # torch 2.13's Dynamo settings are per thread: enable()'s flag reads as
    # off in a new thread, where Dynamo's own exchange would not run.
    for r in run_ranks(tmp_path, 2, "compile_in_thread.py"):
        done = r.event("done")
        # Step 0: 4 against 5 -> dynamic at once, on both ranks.
        assert done["compiles"] == [[0]], (done, r.stderr[-3000:])
        assert done["next"] == 2


def test_a_forked_child_does_not_hang_in_the_package(tmp_path):
    # The child's copy of the channel is forgotten, not closed (closing
    # would wait for Gloo threads that did not survive the fork). The child
    # leaves by os._exit: torch's own Gloo process group hangs a forked
    # child's normal exit, with or without this package.
    for r in run_ranks(tmp_path, 2, "forked_child.py", limit=60):
        done = r.event("done")
        assert done["status"] == 0 and done["waited"] < 5, done
        assert done["enabled"] is True


def test_ranks_compiling_different_modules_get_a_desync_error(tmp_path):
    # torch.compile(module) compiles one torch wrapper frame for every
    # module: the key names what it wraps.
    for r in run_ranks(tmp_path, 2, "desync_modules.py"):
        done = r.event("done")
        assert done["error"] == "desync", (done, r.stderr[-3000:])
        assert "[Linear]" in done["message"] and "[Sequential]" in done["message"], done


def test_an_explicit_timeout_ignores_ccol_timeout_s(tmp_path):
    for r in run_ranks(tmp_path, 2, "explicit_timeout.py", env={"CCOL_TIMEOUT_S": "junk"}):
        done = r.event("done")
        assert done == {"ev": "done", "timeout": 10.0, "compiles": 1}, (done, r.stderr[-3000:])


def test_a_rank_that_dies_of_an_exception_is_reported_lost_not_finished(tmp_path):
    ranks = run_ranks(tmp_path, 2, "dies_of_exception.py")
    assert ranks[1].returncode == 1 and "the real bug, on rank 1" in ranks[1].stderr
    done = ranks[0].event("done")
    assert done["error"] == "peer_lost", done
    assert done["departures"] == [[1, "aborted"]], done
    assert "no more exchanges" not in done["message"]
    # Rank 1's notice, written as it died: rank 0 says why (once).
    line = ("compiler_collectives: job rank 1 failed: it is exiting on an uncaught RuntimeError "
            "(crashed) after exchange #1: the real bug, on rank 1")
    assert ranks[0].stderr.count(line) == 1, ranks[0].stderr[-3000:]


def test_the_package_keeps_dynamos_fold_where_the_join_would_differ(tmp_path):
    # docs/python.md, "Which states Dynamo folds": each case's frame state and
    # compiles on each rank are what PyTorch's own exchange gives that rank.
    # The package twice: flat, and its tree exchange (which yields the join
    # only; a frame that needs every rank's state is exchanged again, flat).
    runs, done = {}, {}
    for run, env in {
        "pytorch": {"CCOL_MODE": "pytorch"},
        "package": {"CCOL_MODE": "package"},
        "tree": {"CCOL_MODE": "package", "CCOL_HIERARCHICAL_FROM": "2"},
    }.items():
        (tmp_path / run).mkdir()
        ranks = run_ranks(tmp_path / run, 2, "fold_rule.py",
                          env={**env, "CCOL_PG_BACKEND": "cpu:gloo"})
        for r in ranks:
            assert r.returncode == 0, (run, r.stderr[-3000:])
        done[run] = [r.event("done") for r in ranks]
        runs[run] = [{e["case"]: e for e in r.events if e["ev"] == "case"} for r in ranks]
    # Every case ran (those that set the exclusion guard from torch 2.12).
    import torch._dynamo.config

    guard = hasattr(torch._dynamo.config, "automatic_dynamic_exclusion_guard")
    cases = {"int_vs_float", "nan", "signed_zero", "mixed_frame", "automatic_dynamic_off"}
    cases |= {"marked_entry_overwrites", "exclusion_guard"} if guard else set()
    assert [set(r) for r in runs["pytorch"]] == [cases, cases], runs["pytorch"]
    assert runs["package"] == runs["pytorch"]
    assert runs["tree"] == runs["pytorch"]
    assert [d["topology"] for d in done["package"]] == ["flat", "flat"]
    assert [d["topology"] for d in done["tree"]] == ["tree", "tree"]
    # One exchange per compile, flat (the enable check is #0); over the
    # tree, one more for each compile that needed every rank's state.
    compiles = sum(len(c["compiles"]) for c in runs["package"][0].values())
    assert done["package"][0]["next"] == 1 + compiles, done
    assert done["tree"][0]["next"] > done["package"][0]["next"], done
    last = {case: [r[case]["steps"][-1] for r in runs["package"]] for case in runs["package"][0]}
    # The values that tell the fold from the join, on both ranks:
    for rank in (0, 1):
        # 3 == 3.0: rank 0's int stays, static.
        assert last["int_vs_float"][rank]["L['s']"][0] == "3"
        # NaN != NaN: dynamic.
        assert last["nan"][rank]["L['s']"][0] == "dyn"
        # 0.0 == -0.0: rank 0's 0.0 stays, static.
        assert last["signed_zero"][rank]["L['s']"][0] == "0.0"
        # Per rank and joined sources in one frame.
        assert last["mixed_frame"][rank]["L['t']"][0] == "3"
        assert last["mixed_frame"][rank]["L['s']"][0] == "dyn"
        assert last["mixed_frame"][rank]["L['x']"][1] == "(dyn, 8)"
        # The last rank's sizes overwrite.
        assert last["automatic_dynamic_off"][rank]["L['x']"][1] == "(5)"
        # The exclusion guard's bookkeeping: a second equal state clears the
        # excluded sizes that the first one's transition recorded.
        if guard:
            assert runs["package"][rank]["exclusion_guard"]["steps"][1]["L['x']"][3] == "None"
    # Rank 1's entry, with the excluded sizes its mark_dynamic recorded,
    # overwrites rank 0's (found by a new user's attack: they did not travel).
    if guard:
        assert last["marked_entry_overwrites"][0]["L['x']"][3] == "(4, 8)"


@pytest.mark.parametrize("form", ["stages", "mesh"])
def test_each_pipeline_stage_agrees_within_its_own_group(tmp_path, form):
    # Two stages of two replicas, each stage compiling its own module with
    # shapes that differ between its replicas; every rank passes its stage
    # (stages: stage A as a list of ranks, stage B as a torch ProcessGroup;
    # mesh: (mesh, "dp") and a 1-D DeviceMesh). Within a stage the replicas
    # take the same decisions; no torch collective runs and no error is
    # raised.
    ranks = run_ranks(tmp_path, 4, "pipeline_groups.py", env={"CCOL_TEST_GROUPS": form})
    for r in ranks:
        done = r.event("done")
        assert r.returncode == 0 and done["error"] is None, (done, r.stderr[-3000:])
        stage = [0, 1] if r.rank < 2 else [2, 3]
        assert (done["group"], done["rank"], done["world"]) == (stage, r.rank % 2, 2), done
        # Scenario 1 in each stage: one compile, dim 0 dynamic, on both replicas.
        assert done["compiles"] == [[0]], done
        # The stage's channel: the enable check and one compile exchange.
        assert done["next"] == 2, done
        assert done["calls"] == {}, "a torch collective ran during the steps"


def test_stages_on_the_world_channel_desync(tmp_path):
    # The same job with enable() on the world: the stages compile different
    # frames at the same exchange, a Desync on every rank, naming both.
    ranks = run_ranks(tmp_path, 4, "pipeline_groups.py", env={"CCOL_TEST_GROUPS": "world"})
    for r in ranks:
        done = r.event("done")
        assert done["error"] == "desync", (done, r.stderr[-3000:])
        assert done["group"] == [0, 1, 2, 3]
        assert "ranks [0,1] at #1 'torch.frame __main__:stage_a:" in done["message"], done
        assert "ranks [2,3] at #1 'torch.frame __main__:stage_b:" in done["message"], done


def test_a_group_errors_name_job_ranks(tmp_path):
    # Stage B's rank 3 never compiles: rank 2 (its stage's rank 0) times out
    # naming job rank 3, not its rank in the stage (1), within the deadline
    # (5 s) + 1 s; stage A is not held up.
    ranks = run_ranks(tmp_path, 4, "pipeline_groups.py", env={"CCOL_TEST_GROUPS": "absent"})
    done = ranks[2].event("done")
    assert done["error"] == "timeout", (done, ranks[2].stderr[-3000:])
    assert done["missing"] == [3], done
    assert "waiting for rank [3]" in done["message"], done
    assert 5.0 <= done["waited"] <= 6.0, done
    for r in ranks[:2]:
        a = r.event("done")
        assert a["error"] is None and a["compiles"] == [[0]], (a, r.stderr[-3000:])
