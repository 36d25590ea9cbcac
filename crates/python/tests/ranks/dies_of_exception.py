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
