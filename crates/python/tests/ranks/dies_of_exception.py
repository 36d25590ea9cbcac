"""The rank program of test_ranks.py::test_a_rank_that_dies_of_an_exception_is_reported_lost_not_finished."""

from prelude import *
from steps import *

cct.enable(timeout=10, exchange="always")  # the recompile is exchanged
f(torch.ones(4, 8))
if RANK == 1:
    raise RuntimeError("the real bug, on rank 1")
try:
    f(torch.ones(6, 8))
    emit(ev="done", error=None)
except compiler_collectives.PeerLost as e:
    emit(ev="done", error=e.kind, departures=e.departures, message=str(e))
    # Long enough for the notice watcher (it looks every 0.2 s) to print
    # rank 1's notice before this rank's normal exit stops it.
    time.sleep(1.0)
