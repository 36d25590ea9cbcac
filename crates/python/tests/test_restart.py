"""No second trace (docs/python.md, "No second trace"): after a frame
exchange the package lets Dynamo's first trace go on where the restart
cannot change anything, and restarts everywhere else; every rank gets the
graphs, guards and code state it gets with the restart (skip_restart=False),
and PyTorch's own (the oracle's corpus, against PyTorch's exchange patched
for CPU). The cases are tests/ranks/restart.py, in one job."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import run_cases

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
HARNESS = os.path.join(REPO, "tests", "pytorch-oracle", "harness.py")
CASES = ("same_shapes", "one_rank_differs", "prior_on_one_rank", "graph_break", "mark_dynamic")


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return run_cases(tmp_path_factory, "restart.py", CASES)


def _done(ranks, case):
    """Each rank's pair of "done" events of `case`: (skip_restart=True, False)."""
    out = []
    for r in ranks:
        by_skip = {e["skip"]: e for e in r.events if e.get("ev") == "done" and e["case"] == case}
        assert set(by_skip) == {True, False}, (case, r.events, r.stderr[-3000:])
        out.append((by_skip[True], by_skip[False]))
    return out


def _same_trace(skipping, restarting):
    """The FX graph code of every compile, and after each step the guards of
    every cache entry and the code state (every field), are those of the run
    that always restarts; the ranks exchanged as often."""
    assert skipping["graphs"] == restarting["graphs"]
    assert skipping["steps"] == restarting["steps"]
    assert skipping["exchanges"] == restarting["exchanges"]
    assert restarting["restart_skipped"] == 0
    assert len(restarting["lines"]) == restarting["restarted"] > 0
    assert all(line.endswith(": restart: skip_restart=False") for line in restarting["lines"])


def _symbolic(graph: str) -> bool:
    """Whether an FX graph's forward takes a size symbol (a dim compiled
    dynamic)."""
    signature = graph.split("def forward(self, ", 1)[1].split(")", 1)[0]
    return "torch.SymInt" in signature


def test_a_first_compile_with_the_same_shapes_everywhere_is_traced_once(cases):
    for skipping, restarting in _done(cases, "same_shapes"):
        _same_trace(skipping, restarting)
        # The first compile: one analysis instead of two; the recompile on
        # (5, 8) is local (the default policy), one analysis either way.
        assert (skipping["restart_skipped"], skipping["restarted"]) == (1, 0)
        assert (restarting["restart_skipped"], restarting["restarted"]) == (0, 1)
        assert (skipping["attempts"], restarting["attempts"]) == (2, 3)
        assert "restart skipped (2 sources consulted, each folds to the entry the first " \
               "trace used)" in skipping["lines"][0]
        # The skip folded the code state as the restart does: the local
        # recompile's automatic dynamic made dim 0 dynamic.
        first, second = skipping["steps"]
        assert first["code_state"]["L['x']"]["size"] == "(8, 8)"
        assert second["code_state"]["L['x']"]["size"] == "(<AutoDynamic.token: 0>, 8)"
        assert [_symbolic(g) for g in skipping["graphs"]] == [False, True]


def test_a_rank_whose_shape_differs_makes_every_rank_restart(cases):
    for skipping, restarting in _done(cases, "one_rank_differs"):
        _same_trace(skipping, restarting)
        assert (skipping["restart_skipped"], skipping["restarted"]) == (0, 1)
        assert skipping["attempts"] == restarting["attempts"] == 2
        # The DEBUG line names the first source whose entry the fold changed.
        assert len(skipping["lines"]) == 1
        assert ": restart: L['x']: the preflight used (scalar=" in skipping["lines"][0]
        assert "the fold gives (scalar=<AutoDynamic.token: 0>, size=(<AutoDynamic.token: 0>, " \
               "8)" in skipping["lines"][0]


def test_ranks_that_decide_differently_run_on_each_with_the_graph_the_restart_gives(cases):
    (zero_skip, zero_restart), (one_skip, one_restart) = _done(cases, "prior_on_one_rank")
    _same_trace(zero_skip, zero_restart)
    _same_trace(one_skip, one_restart)
    # Rank 0's prior entry (dim 0 dynamic) changes its fold: it restarts and
    # compiles dim 0 dynamic. Rank 1's fold is its observation: it goes on.
    # The exchange ran once on each, and neither waits for the other.
    assert (zero_skip["restart_skipped"], zero_skip["restarted"]) == (0, 1)
    assert (one_skip["restart_skipped"], one_skip["restarted"]) == (1, 0)
    assert (zero_skip["attempts"], one_skip["attempts"]) == (2, 1)
    assert zero_skip["exchanges"] == one_skip["exchanges"]
    assert [_symbolic(g) for g in zero_skip["graphs"]] == [True]
    assert [_symbolic(g) for g in one_skip["graphs"]] == [False]


def test_a_frame_with_a_graph_break_is_analysed_three_times_fewer(cases):
    for skipping, restarting in _done(cases, "graph_break"):
        _same_trace(skipping, restarting)
        # b and its resume function, first compiled with the same shapes:
        # both skip (b's first compile analyses twice, for the graph break,
        # not four times; the resume function once, not twice). Both
        # recompiles on (4, 8) (exchange="always") restart.
        assert (skipping["restart_skipped"], skipping["restarted"]) == (2, 2)
        assert restarting["restarted"] == 4
        assert restarting["attempts"] - skipping["attempts"] == 3


def test_a_dim_marked_dynamic_makes_its_rank_restart(cases):
    # The builder changes a marked source's entry after recording it, and
    # changes the folded one again in the restart (its excluded sizes): no
    # skip (test_ranks.py's fold-rule test compares those with PyTorch's).
    for skipping, restarting in _done(cases, "mark_dynamic"):
        _same_trace(skipping, restarting)
        assert (skipping["restart_skipped"], skipping["restarted"]) == (0, 1)
        assert ": restart: L['x']: its entry was changed after it was recorded (a dim marked " \
               "dynamic)" in skipping["lines"][0]
        assert [_symbolic(g) for g in skipping["graphs"]] == [True]


def test_the_package_traces_as_pytorch_in_every_scenario(tmp_path):
    """The oracle's corpus on this torch, every job expected to finish, in
    every mode that enables the package (in no_collectives both runs are
    PyTorch alone): PyTorch's exchange (patched for CPU) and the package's
    run at the same time, then compared job by job (harness.py
    --compare-detail). The cargo oracle test does the same on 2.13.0 and
    2.14.1."""
    scenarios = os.path.join(REPO, "tests", "scenarios")
    files = sorted(os.path.join(scenarios, f) for f in os.listdir(scenarios)
                   if f.endswith(".json") and not f.endswith(".schema.json"))
    # By world size: the harness starts a set of rank processes per size.
    files.sort(key=lambda f: json.load(open(f)).get("world_size", 2))
    env = dict(os.environ)
    env.pop("CCOL_TIMEOUT_S", None)
    env.pop("CCOL_ORACLE_DETAIL_DIR", None)
    runs = [
        subprocess.Popen([sys.executable, HARNESS, "--batch", "--finishing", "--detail-dir",
                          str(tmp_path), "--exchange", exchange, "--mode", "collectives",
                          "--mode", "guard_collectives",
                          "--mode", "collectives_and_guard_collectives", *files],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for exchange in ("pytorch", "package")
    ]
    for run in runs:
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, err[-3000:]
        jobs = [json.loads(line) for line in out.splitlines()]
        assert jobs and all(j["status"] in ("ok", "unsupported") for j in jobs), out
    compared = subprocess.run([sys.executable, HARNESS, "--compare-detail", str(tmp_path)],
                              capture_output=True, text=True, timeout=60)
    print(compared.stdout.splitlines()[-1])
    assert compared.returncode == 0, compared.stdout[-6000:]
    summary = json.loads(compared.stdout.splitlines()[-1])
    assert summary["differ"] == 0
    assert summary["compared"] >= 40
    assert summary["restart_skipped"] > 0 and summary["restarted"] > 0
