"""compiler_collectives: every rank's compiler takes the same compile-time decisions.

The Python package of the compiler-collectives project. For torch.compile::

    import torch.distributed as dist
    import compiler_collectives.torch

    dist.init_process_group("gloo")          # or torchrun's env://
    compiler_collectives.torch.enable()      # Dynamo's compiler collectives, on our protocol

    try:
        loss = compiled_model(batch)
    except compiler_collectives.Error as e:  # Timeout, PeerLost, Desync, ...
        print(e.kind, e.missing_ranks, e.exchange)
        raise

Importing this module does not import torch; ``compiler_collectives.torch``
does. See docs/python.md in the repository.
"""

from ._errors import (
    BackendError,
    ChannelUnusable,
    DecodeError,
    Desync,
    Disagreement,
    Error,
    GraphMismatch,
    IncompatibleTorch,
    InvalidArgument,
    PeerCompileFailed,
    PeerLost,
    Timeout,
    Unsupported,
    VersionMismatch,
)
from ._native import VERSION as __version__
from ._native import WIRE_VERSION
from ._native import _use_gloo_adapter

# The Gloo adapter ships in this directory (the wheel's copy links the Gloo
# libraries the wheel carries); the first CompileChannel loads it from here.
_use_gloo_adapter(__path__[0])
del _use_gloo_adapter

__all__ = [
    "BackendError",
    "ChannelUnusable",
    "DecodeError",
    "Desync",
    "Disagreement",
    "Error",
    "GraphMismatch",
    "IncompatibleTorch",
    "InvalidArgument",
    "PeerCompileFailed",
    "PeerLost",
    "Timeout",
    "Unsupported",
    "VersionMismatch",
    "WIRE_VERSION",
    "__version__",
]
