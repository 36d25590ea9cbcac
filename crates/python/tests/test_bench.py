"""bench/torch_compiler_collective.py runs and reports both exchanges (a
smoke run: one compile each; the figures themselves come from the bench)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench" / "torch_compiler_collective.py"


def test_the_bench_times_both_exchanges_in_one_run():
    out = subprocess.run(
        [sys.executable, str(BENCH), "--ranks", "2", "--sources", "6", "--compiles", "1",
         "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["ranks"], r["sources"], r["states"]) for r in rows] == [
        (2, 6, "differ"), (2, 6, "same"),
    ]
    for r in rows:
        for field in ("pytorch_ms_p50", "package_ms_p50", "pytorch_exchange_call_ms_p50",
                      "package_exchange_call_ms_p50"):
            assert r[field] > 0, (field, r)
        assert r["pytorch_over_package"] == pytest.approx(r["pytorch_ms_p50"] / r["package_ms_p50"])
        pc = r["per_compile"]
        # Per compile: the two sides paired, compile k over compile k, and
        # the row's median of those ratios beside the ratio of medians.
        for what, key in (("step", "step_ratio"), ("step_fold", "step_fold_ratio"),
                          ("wall", "compile_wall_ratio")):
            mine = [p / q for p, q in zip(pc[f"pytorch_{what}_ms"], pc[f"package_{what}_ms"])]
            assert pc[key] == pytest.approx(mine), (what, r)
        assert r["pytorch_over_package_per_compile_p50"] == pytest.approx(pc["step_ratio"][0])
        # Step + fold is the step plus Dynamo's fold, and the fold ran.
        for side in ("pytorch", "package"):
            assert r[f"{side}_fold_ms_p50"] > 0, (side, r)
            assert r[f"{side}_step_fold_ms_p50"] == pytest.approx(
                r[f"{side}_ms_p50"] + r[f"{side}_fold_ms_p50"]), (side, r)
            assert r[f"{side}_compile_wall_ms_p50"] > r[f"{side}_step_fold_ms_p50"], (side, r)
            assert all(n >= 1 for rank in r["raw_s"][side]["fold_calls"] for n in rank), r


def test_the_bench_prints_a_saved_run_without_running_one(tmp_path):
    row = {
        "ranks": 2, "sources": 6, "states": "differ", "compiles": 1, "torch": "2.15.0",
        "pytorch_ms_p50": 8.0, "package_ms_p50": 2.0, "pytorch_over_package": 4.0,
        "pytorch_over_package_per_compile_p50": 4.0,
        "pytorch_exchange_call_ms_p50": 7.0, "package_exchange_call_ms_p50": 1.0,
        "exchange_call_pytorch_over_package": 7.0,
        "pytorch_step_fold_ms_p50": 9.0, "package_step_fold_ms_p50": 3.0,
        "step_fold_pytorch_over_package_per_compile_p50": 3.0,
        "pytorch_compile_wall_ms_p50": 100.0, "package_compile_wall_ms_p50": 90.0,
        "per_compile": {"step_ratio": [4.0], "step_fold_ratio": [3.0]},
    }
    saved = tmp_path / "run.jsonl"
    saved.write_text(json.dumps(row) + "\n")
    out = subprocess.run([sys.executable, str(BENCH), "--from", str(saved)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    table = out.stdout.splitlines()
    assert table[2].split() == ["2", "6", "differ", "8.00", "ms", "2.00", "ms", "4.00x", "4.00x",
                                "7.00", "ms", "1.00", "ms", "7.00x", "9.00", "ms", "3.00", "ms",
                                "3.00x", "100.0", "ms", "90.0", "ms"], out.stdout
    assert "step: 4.00" in out.stdout and "step + fold: 3.00" in out.stdout
    # The same row as Markdown, for docs/performance.md.
    row.update({"pytorch_fold_ms_p50": 1.0, "package_fold_ms_p50": 1.0})
    saved.write_text(json.dumps(row) + "\n")
    out = subprocess.run([sys.executable, str(BENCH), "--from", str(saved), "--markdown"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[2] == (
        "| 2 | 6 | differ | 8.00 | 2.00 | **4.00×** | 4.00× | 9.00 | 3.00 | **3.00×**"
        " | 1.00 | 1.00 | 100 | 90 |"), out.stdout


def test_the_enable_cost_bench_times_the_rendezvous_and_agreeing_compiles():
    bench = BENCH.parent / "torch_enable_cost.py"
    out = subprocess.run(
        [sys.executable, str(bench), "--ranks", "2", "--repeats", "2", "--compile-ranks", "2",
         "--sources", "4", "--compiles", "1", "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    enable, compile_ = [json.loads(line) for line in out.stdout.splitlines()]
    assert (enable["what"], enable["ranks"], len(enable["enable_ms"])) == ("enable", 2, 2)
    assert all(v > 0 for v in enable["enable_ms"]), enable
    assert enable["enable_ms_p50"] == pytest.approx(sum(enable["enable_ms"]) / 2)
    assert (compile_["what"], compile_["ranks"], compile_["sources"]) == ("compile", 2, 4)
    # Collectives off run no step; both exchanges run one.
    assert compile_["off_step_ms_p50"] == 0
    assert compile_["pytorch_step_ms_p50"] > 0 and compile_["package_step_ms_p50"] > 0
    for side in ("pytorch", "package"):
        assert compile_[f"{side}_extra_ms_p50"] == pytest.approx(
            compile_[f"{side}_wall_ms"][0] - compile_["off_wall_ms"][0]), side


def test_the_alloc_bench_counts_what_one_exchange_builds():
    bench = BENCH.parent / "torch_exchange_alloc.py"
    out = subprocess.run(
        [sys.executable, str(bench), "--ranks", "2", "--sources", "30", "--calls", "3", "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    differ, same = [json.loads(line) for line in out.stdout.splitlines()]
    # Differing states: Dynamo gets the join, one state, holding 10 new
    # entries (the sources whose dim 0 differs) and the copied dict.
    assert (differ["states"], differ["states_handed"]) == ("differ", 1), differ
    assert differ["blocks_p50"] >= 10 and differ["held_kib_p50"] > 1, differ
    # The same state on every rank: the rank's own LocalState, nothing built.
    assert (same["states"], same["states_handed"]) == ("same", 1), same
    assert same["blocks_p50"] < differ["blocks_p50"], (same, differ)


POLICY_BENCH = BENCH.parent / "torch_policy_cost.py"


def test_the_policy_bench_times_a_step_in_each_mode():
    # A smoke run (one round of 5 steps, no first-step runs): the all-reduce
    # turns votes on under the default, and only there.
    out = subprocess.run(
        [sys.executable, str(POLICY_BENCH), "--rounds", "1", "--steps", "5",
         "--first-step-rounds", "0", "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    (row,) = [json.loads(line) for line in out.stdout.splitlines()]
    assert [row[f"{m} votes_on"] for m in ("none", "package, no votes",
                                          "package, votes (default)")] == [False, False, True]
    for m in ("none", "package, no votes", "package, votes (default)"):
        assert row[m] > 0, row
    assert row["vote us"] == pytest.approx(row["package, votes (default)"]
                                           - row["package, no votes"])


def test_the_restart_bench_counts_dynamos_analyses_in_each_mode():
    # A smoke run (one repeat of 4 layers at 2 ranks, no train_lm.py runs).
    out = subprocess.run(
        [sys.executable, str(BENCH.parent / "torch_restart_cost.py"), "--ranks", "2",
         "--repeats", "1", "--layers", "4", "--warm-runs", "0", "--with-restart-mode",
         "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    rows = {r["what"]: r for r in (json.loads(line) for line in out.stdout.splitlines())}
    attempts = {case: [rows[case][f"{m}_attempts"] for m in ("off", "pytorch", "package",
                                                             "package_restart")]
                for case in ("first", "differ", "break")}
    # The same shapes everywhere: the package analyses as often as with
    # collectives off. Shapes that differ: every exchange restarts. A graph
    # break: the frame (2 analyses, 4 with a restart) and its resume
    # function (1, 2 with a restart).
    assert attempts == {"first": [1, 2, 1, 2], "differ": [1, 2, 2, 2], "break": [3, 6, 3, 6]}
    for row in rows.values():
        assert row["package_over_off_p50"] == pytest.approx(
            row["package_wall_s"][0] / row["off_wall_s"][0])
