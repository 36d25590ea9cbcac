"""train_lm.py's model and data under Hugging Face accelerate, with
compiler_collectives enabled after ``Accelerator()`` (which creates the
process group): nothing else changes in the training script.

Launch two CPU processes (accelerate's ``--cpu --num_processes 2`` starts
one process; ``--multi_gpu`` with ``Accelerator(cpu=True)`` starts two, on
Gloo)::

    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \\
        --mixed_precision no --dynamo_backend no \\
        crates/python/examples/accelerate_lm.py --steps 6

Options (as train_lm.py's): --exchange package|none, --backend, --steps,
--timeout, --corpus, --seed, --short-last-batch-rank R (rank R's last batch
has 1 row), --eval-rank0-step K (the main process evaluates alone before
step K, inside ``compiler_collectives.torch.local()``), --report PATH (each
rank writes its compile steps and losses to PATH.<rank>.json).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator

from train_lm import (TinyLM, batches, common_args, counting_backend, end, evaluate,
                      read_corpus, write_report)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exchange", choices=["package", "none"], default="package")
    ap.add_argument("--eval-rank0-step", type=int, default=None)
    common_args(ap)
    a = ap.parse_args()

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    if a.exchange == "package":
        import compiler_collectives.torch

        # After Accelerator(): its process group exists now.
        compiler_collectives.torch.enable(timeout=a.timeout)

    torch.manual_seed(a.seed)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    prepared, opt = accelerator.prepare(model, opt)
    compile_steps: list[int] = []
    step_now = [0]
    compiled = torch.compile(prepared, backend=counting_backend(a.backend, compile_steps, step_now))
    loss_fn = nn.CrossEntropyLoss()
    losses: list[float] = []
    eval_losses: list[float] = []
    last_batch = 1 if a.short_last_batch_rank == rank else None
    corpus = read_corpus(a.corpus)
    for step, (x, y) in enumerate(batches(corpus, rank, a.steps, a.seed, last_batch=last_batch)):
        step_now[0] = step
        if a.eval_rank0_step == step and accelerator.is_main_process:
            eval_losses.append(evaluate(compiled, model, loss_fn, x, y, a.exchange == "package"))
        opt.zero_grad(set_to_none=True)
        logits = compiled(x)
        loss = loss_fn(logits.reshape(-1, 256), y.reshape(-1))
        accelerator.backward(loss)
        opt.step()
        losses.append(loss.item())
    if a.report:
        write_report(f"{a.report}.{rank}.json", {
            "rank": rank,
            "world_size": accelerator.num_processes,
            "compile_steps": compile_steps,
            "losses": [float.hex(v) for v in losses],
            "eval_losses": [float.hex(v) for v in eval_losses],
            "steps_done": len(losses),
        })
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print(f"accelerate_lm: {a.steps} steps on {accelerator.num_processes} processes, "
              f"final loss {losses[-1]:.4f}, compiles at steps {compile_steps}", flush=True)
    if a.exchange == "package":
        compiler_collectives.torch.disable()
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    end(main())
