"""The package where users train, 2 CPU ranks over Gloo, ``aot_eager``:
torchrun + DDP (crates/python/examples/train_lm.py), Hugging Face accelerate
(accelerate_lm.py) and Lightning with the package's callback
(lightning_lm.py). The three examples train the same model on the same data
with the same schedule — rank 1's last batch of one row, and (DDP,
accelerate) rank 0 evaluating alone before step 3 — so one job without the
package, train_lm.py's, is the reference every stack's losses must equal to
the bit. accelerate and Lightning are installed into the torch environment
by scripts/setup-integrations.sh (the README's test command runs it)."""

from __future__ import annotations

import json
import os
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
#: The schedule every stack runs: rank 1's last batch has one row.
SCHEDULE = ("--short-last-batch-rank", "1")
#: Rank 0 evaluates alone (eval(), no_grad) before this step (DDP, accelerate).
EVAL_STEP = 3
#: The README's test command sets it for its smoke set on the older torch
#: versions: each stack's job runs and its compiles and stages are checked,
#: but not its losses against the reference job (the whole suite does that).
SMOKE = os.environ.get("CCOL_SMOKE_SET") == "1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(script: str, *args):
    return [BIN / "torchrun", "--standalone", "--nproc-per-node=2", EXAMPLES / script,
            *SCHEDULE, *args]


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


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """train_lm.py without the package (torchrun + DDP), with rank 0's
    evaluation and a graph break on rank 1 alone from step 4 (neither
    changes what is computed); None in the smoke set."""
    if SMOKE:
        return None
    ranks = _run(_torchrun("train_lm.py", "--exchange", "none", "--eval-rank0-step", EVAL_STEP,
                           "--graph-break-rank", "1", "--graph-break-step", "4"),
                 tmp_path_factory.mktemp("reference"), "none")
    # Without the package each rank compiles static at step 0, then dynamic.
    assert [r["compile_steps"][:2] for r in ranks] == [[0, 1], [0, 1]], ranks
    assert len(ranks[0]["eval_losses"]) == 1 and ranks[1]["eval_losses"] == []
    return ranks


def _same_losses(ours, reference, eval_too: bool) -> None:
    if reference is None:
        return
    for mine, alone in zip(ours, reference):
        assert mine["steps_done"] == alone["steps_done"] == STEPS
        assert mine["losses"] == alone["losses"], (mine["rank"], mine["losses"], alone["losses"])
        if eval_too:
            assert mine["eval_losses"] == alone["eval_losses"], mine["rank"]


def test_torchrun_ddp_runs_rank_local_recompiles_as_without_the_package(tmp_path, reference):
    # A last batch of one row on rank 1, rank 0 evaluating alone, and a
    # graph break on rank 1 alone from step 4: each a recompile on one rank,
    # which the default policy keeps there.
    ours = _run(_torchrun("train_lm.py", "--exchange", "package", "--eval-rank0-step", EVAL_STEP,
                          "--graph-break-rank", "1", "--graph-break-step", "4"),
                tmp_path, "package")
    steps = [r["compile_steps"] for r in ours]
    # Step 0 agreed (one compile each, the sequence dim dynamic at once),
    # then rank 0's evaluation, rank 1's graph break and short batch.
    assert steps[0] == [0, EVAL_STEP], steps
    assert steps[1][0] == 0 and steps[1].count(0) == 1 and EVAL_STEP not in steps[1], steps
    assert 4 in steps[1] and 5 in steps[1], steps
    _same_losses(ours, reference, eval_too=True)


def test_accelerate_runs_as_without_the_package(tmp_path, reference):
    pytest.importorskip("accelerate", reason="accelerate is not installed in this torch "
                        "environment (scripts/setup-integrations.sh installs it)")
    # accelerate's working CPU launch: --multi_gpu with Accelerator(cpu=True)
    # (--cpu --num_processes 2 starts one process).
    ours = _run([BIN / "accelerate", "launch", "--multi_gpu", "--num_processes", "2",
                 "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                 "--main_process_port", str(_free_port()), EXAMPLES / "accelerate_lm.py",
                 *SCHEDULE, "--eval-rank0-step", EVAL_STEP, "--exchange", "package"],
                tmp_path, "package")
    assert [r["world_size"] for r in ours] == [2, 2]
    # Step 0 agreed; then rank 0's evaluation (inside local()) and rank 1's
    # last batch, each on its own rank.
    assert [r["compile_steps"] for r in ours] == [[0, EVAL_STEP], [0, 5]]
    _same_losses(ours, reference, eval_too=True)


def test_lightning_fit_validate_and_test_with_the_callback(tmp_path, reference):
    pytest.importorskip("lightning", reason="Lightning is not installed in this torch "
                        "environment (scripts/setup-integrations.sh installs it)")
    ours = _run(_torchrun("lightning_lm.py", "--exchange", "package"), tmp_path, "package")
    for r in ours:
        # fit, then validate and test in the same process: Lightning ran
        # setup three times, the callback enabled the package once.
        assert r["stages"] == ["fit", "validate", "test"], r
        assert r["enabled"] is True and r["enabled_here"] is True, r
    # Step 0 agreed; rank 1's short last batch recompiles there alone;
    # validation (no_grad) recompiles on each rank at the end of fit, and
    # validate and test reuse that graph.
    assert [r["compile_steps"] for r in ours] == [["fit:0", "fit:6"], ["fit:0", "fit:5", "fit:6"]]
    _same_losses(ours, reference, eval_too=False)


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
