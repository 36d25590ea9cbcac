"""The rank program of test_ranks.py::test_a_rank_waiting_alone_times_out_naming_the_other_within_the_deadline."""

from prelude import *
from steps import *

cct.enable(timeout=3, exchange="always")
f(torch.ones(4, 8))
if RANK == 1:
    time.sleep(8)
    emit(ev="done")
else:
    start = time.monotonic()
    try:
        f(torch.ones(6, 8))
        emit(ev="done", error=None)
    except compiler_collectives.Timeout as e:
        emit(ev="done", error=e.kind, missing=e.missing_ranks, exchange=e.exchange,
             waited=time.monotonic() - start, is_builtin_timeout=isinstance(e, TimeoutError))
