"""The rank program of test_ranks.py::test_ranks_at_different_frames_get_a_desync_error."""

from prelude import *

@torch.compile(backend="eager")
def f(x):
    return x + 1

@torch.compile(backend="eager")
def g(x):
    return x - 1

cct.enable(timeout=30)
try:
    (f if RANK == 0 else g)(torch.ones(3))
    emit(ev="done", error=None)
except compiler_collectives.Error as e:
    emit(ev="done", error=type(e).__name__, kind=e.kind, message=str(e), exchange=e.exchange)
