"""train_lm.py's model and data as a LightningModule, trained with
Lightning's DDP strategy on CPU, with compiler_collectives enabled by its
Lightning callback; then ``validate`` and ``test`` in the same process.

Launch it under torchrun (Lightning joins torchrun's processes) or let
Lightning start the processes itself (``python lightning_lm.py``)::

    torchrun --standalone --nproc-per-node 2 crates/python/examples/lightning_lm.py --steps 6

Each rank's training data is its own list of windows of the corpus, with
lengths drawn per rank (train_lm.py's ``batches``). Options: --exchange
package|none, --backend, --steps, --timeout, --corpus, --seed,
--short-last-batch-rank R (rank R's last batch has 1 row), --report PATH
(each rank writes its compile steps, losses and the stages it ran to
PATH.<rank>.json).
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
import torch.nn as nn

from train_lm import TinyLM, batches, common_args, end, read_corpus, write_report


class Batches(torch.utils.data.Dataset):
    """A rank's precomputed batches, one item each (the loader's batch size
    is None: items are batches already)."""

    def __init__(self, items) -> None:
        self.items = list(items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class LitLM(L.LightningModule):
    def __init__(self, a, compile_steps: list) -> None:
        super().__init__()
        self.a = a
        self.model = TinyLM()
        self.loss_fn = nn.CrossEntropyLoss()
        self.compile_steps = compile_steps
        self.losses: list[float] = []
        self.stages: list[str] = []
        from torch._dynamo.backends.registry import lookup_backend

        inner = lookup_backend(a.backend)

        def backend(gm, example_inputs):
            stage = self.trainer.state.fn
            compile_steps.append(f"{getattr(stage, 'value', stage)}:{self.global_step}")
            return inner(gm, example_inputs)

        self.compiled = torch.compile(self.model, backend=backend)

    def _loader(self, steps: int, last_batch=None):
        rank = self.trainer.global_rank
        corpus = read_corpus(self.a.corpus)
        data = Batches(batches(corpus, rank, steps, self.a.seed, last_batch=last_batch))
        return torch.utils.data.DataLoader(data, batch_size=None, shuffle=False)

    def train_dataloader(self):
        short = self.a.short_last_batch_rank == self.trainer.global_rank
        return self._loader(self.a.steps, last_batch=1 if short else None)

    def val_dataloader(self):
        return self._loader(2)

    def test_dataloader(self):
        return self._loader(2)

    def _loss(self, batch):
        x, y = batch
        return self.loss_fn(self.compiled(x).reshape(-1, 256), y.reshape(-1))

    def training_step(self, batch, _index):
        loss = self._loss(batch)
        self.losses.append(loss.item())
        return loss

    def validation_step(self, batch, _index):
        self._loss(batch)

    def test_step(self, batch, _index):
        self._loss(batch)

    def setup(self, stage: str) -> None:
        self.stages.append(str(getattr(stage, "value", stage)))

    def configure_optimizers(self):
        return torch.optim.SGD(self.model.parameters(), lr=0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exchange", choices=["package", "none"], default="package")
    common_args(ap)
    a = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    callbacks = []
    callback = None
    if a.exchange == "package":
        from compiler_collectives.lightning import CompilerCollectives

        callback = CompilerCollectives(timeout=a.timeout)
        callbacks.append(callback)
    compile_steps: list = []
    module = LitLM(a, compile_steps)
    trainer = L.Trainer(
        accelerator="cpu", devices=2, num_nodes=1, strategy="ddp", max_epochs=1,
        callbacks=callbacks, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        # Each rank's data is its own already (train_lm.py's batches).
        use_distributed_sampler=False,
    )
    trainer.fit(module)
    trainer.validate(module, verbose=False)
    trainer.test(module, verbose=False)
    rank = trainer.global_rank
    if a.report:
        import compiler_collectives.torch as cct

        write_report(f"{a.report}.{rank}.json", {
            "rank": rank,
            "compile_steps": compile_steps,
            "losses": [float.hex(v) for v in module.losses],
            "stages": module.stages,
            "steps_done": len(module.losses),
            "enabled": cct.is_enabled(),
            "enabled_here": bool(callback and callback.enabled_here),
        })
    if rank == 0:
        print(f"lightning_lm: fit, validate and test; compiles at {compile_steps}", flush=True)
    return 0


if __name__ == "__main__":
    end(main())
