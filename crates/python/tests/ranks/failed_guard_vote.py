"""The rank program of test_ranks.py::test_a_failed_guard_vote_raises_on_the_recompile_path_instead_of_aborting."""

from prelude import *
from steps import *

cct.enable(timeout=10, guard_votes=True)
f(torch.ones(4, 8))
if RANK == 1:
    os._exit(0)
try:
    f(torch.ones(4, 8))
    emit(ev="done", error=None)
except compiler_collectives.Error as e:
    emit(ev="done", error=type(e).__name__, kind=e.kind, missing=e.missing_ranks,
         exchange=e.exchange, chain=repr(e.__context__))
