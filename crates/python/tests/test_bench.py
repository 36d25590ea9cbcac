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
