"""The package under Lightning: a ``Callback`` that enables it where the
process group exists.

::

    import lightning as L
    from compiler_collectives.lightning import CompilerCollectives

    trainer = L.Trainer(strategy="ddp", callbacks=[CompilerCollectives(timeout=120)])
    trainer.fit(model)          # then validate, test, predict: enabled once

Lightning creates the process group in its strategy's environment set-up,
before any callback's ``setup``; it calls ``setup`` and ``teardown`` once
for each of fit, validate, test and predict. So the callback enables the
package at the first ``setup`` of the process, and leaves it enabled until
the process exits (``enable`` registers ``disable`` at exit), not until
``teardown``: a second ``enable`` in one process would be refused, and a
later stage's compiles agree on the same channel.

Needs ``lightning`` (``pip install "compiler-collectives[lightning]"``) or
``pytorch_lightning``; importing this module imports the first found.
"""

from __future__ import annotations

import logging
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package of Lightning before 2.0's rename
    try:
        from pytorch_lightning.callbacks import Callback
    except ImportError as e:
        raise ImportError(
            "compiler_collectives.lightning needs Lightning: pip install "
            "'compiler-collectives[lightning]' (or lightning, or pytorch_lightning)"
        ) from e

__all__ = ["CompilerCollectives"]

log = logging.getLogger("compiler_collectives.lightning")


class CompilerCollectives(Callback):
    """Enables ``compiler_collectives.torch`` once per process, at the first
    ``setup`` (fit, validate, test or predict), with ``enable_kwargs``
    (``timeout``, ``exchange``, ``guard_votes``, ``group``, …: see
    :func:`compiler_collectives.torch.enable`).

    Does nothing where no process group is initialised (a single-process
    run) or where the package is enabled already (by the user, or by
    another instance). ``enable``'s errors (``InvalidArgument``,
    ``Disagreement``, ``Timeout``, ``IncompatibleTorch``, …) are raised from
    ``setup``, so the trainer stops before any step.
    """

    def __init__(self, **enable_kwargs: Any) -> None:
        super().__init__()
        self.enable_kwargs = enable_kwargs
        #: Whether this callback enabled the package.
        self.enabled_here = False

    def setup(self, trainer, pl_module, stage: str) -> None:
        import torch.distributed as dist

        import compiler_collectives.torch as cct

        if cct.is_enabled():
            return
        if not (dist.is_available() and dist.is_initialized()):
            log.info("compiler_collectives: no process group (a single process): not enabled")
            return
        cct.enable(**self.enable_kwargs)
        self.enabled_here = True
        log.info("compiler_collectives: enabled at Lightning's %s set-up", stage)
