"""The package where users train: Hugging Face accelerate
(crates/python/examples/accelerate_lm.py) and Lightning with the package's
callback (crates/python/examples/lightning_lm.py), 2 CPU ranks over Gloo,
each with and without the package. accelerate and Lightning are installed
into the torch environment by scripts/setup-integrations.sh (the README's
test command runs it)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import Proc, finish
from test_train import env as _env

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
BIN = Path(sys.executable).parent
STEPS = 6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd, tmp_path, name, limit=400):
    report = tmp_path / name
    job = Proc(name, [*cmd, "--steps", STEPS, "--report", report], env=_env())
    finish([job], limit)
    out = subprocess.CompletedProcess(job.popen.args, job.returncode, job.stdout.text(),
                                      job.stderr.text())
    assert out.returncode == 0, out.stderr[-4000:]
    # A job that ends normally prints no notice.
    assert "compiler_collectives: job rank" not in out.stdout + out.stderr
    ranks = []
    for r in range(2):
        path = Path(f"{report}.{r}.json")
        assert path.exists(), f"rank {r} wrote no report:\n{out.stderr[-4000:]}"
        ranks.append(json.loads(path.read_text()))
    return ranks


def test_accelerate_with_the_package_runs_as_without_it(tmp_path):
    pytest.importorskip("accelerate", reason="accelerate is not installed in this torch "
                        "environment (scripts/setup-integrations.sh installs it)")

    def launch(*args):
        # accelerate's working CPU launch: --multi_gpu with Accelerator(cpu=True)
        # (--cpu --num_processes 2 starts one process).
        return [BIN / "accelerate", "launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", str(_free_port()), EXAMPLES / "accelerate_lm.py",
                "--short-last-batch-rank", "1", "--eval-rank0-step", "3", *args]

    ours = _run(launch("--exchange", "package"), tmp_path, "package")
    theirs = _run(launch("--exchange", "none"), tmp_path, "none")
    assert [r["world_size"] for r in ours] == [2, 2]
    # Step 0 agreed: one compile each, the sequence dim dynamic at once; then
    # rank 0's evaluation (inside local()) and rank 1's last batch of 1 row,
    # each on its own rank.
    assert [r["compile_steps"] for r in ours] == [[0, 3], [0, 5]]
    # Without the package each rank compiles static, then dynamic at step 1.
    assert [r["compile_steps"][:2] for r in theirs] == [[0, 1], [0, 1]]
    for mine, alone in zip(ours, theirs):
        assert mine["steps_done"] == alone["steps_done"] == STEPS
        assert mine["losses"] == alone["losses"], (mine["rank"], mine["losses"], alone["losses"])
        assert mine["eval_losses"] == alone["eval_losses"]
    assert len(ours[0]["eval_losses"]) == 1


def test_lightning_fit_validate_and_test_with_the_callback(tmp_path):
    pytest.importorskip("lightning", reason="Lightning is not installed in this torch "
                        "environment (scripts/setup-integrations.sh installs it)")

    def torchrun(*args):
        return [BIN / "torchrun", "--standalone", "--nproc-per-node=2",
                EXAMPLES / "lightning_lm.py", "--short-last-batch-rank", "1", *args]

    ours = _run(torchrun("--exchange", "package"), tmp_path, "package")
    theirs = _run(torchrun("--exchange", "none"), tmp_path, "none")
    for r in ours:
        # fit, then validate and test in the same process: Lightning ran
        # setup three times, the callback enabled the package once.
        assert r["stages"] == ["fit", "validate", "test"], r
        assert r["enabled"] is True and r["enabled_here"] is True, r
    # Step 0 agreed; rank 1's short last batch recompiles there alone;
    # validation (no_grad) recompiles on each rank at the end of fit, and
    # validate and test reuse that graph.
    assert [r["compile_steps"] for r in ours] == [["fit:0", "fit:6"], ["fit:0", "fit:5", "fit:6"]]
    for mine, alone in zip(ours, theirs):
        assert mine["steps_done"] == alone["steps_done"] == STEPS
        assert mine["losses"] == alone["losses"], (mine["rank"], mine["losses"], alone["losses"])
        assert alone["enabled"] is False


def test_the_lightning_callback_without_a_process_group_does_nothing():
    pytest.importorskip("lightning", reason="Lightning is not installed in this torch "
                        "environment (scripts/setup-integrations.sh installs it)")
    import torch.distributed as dist

    import compiler_collectives.torch as cct
    from compiler_collectives.lightning import CompilerCollectives

    assert not dist.is_initialized()
    callback = CompilerCollectives(timeout=5)
    callback.setup(None, None, "fit")
    assert callback.enabled_here is False and not cct.is_enabled()
