"""The rank program of test_ranks.py::test_suppress_errors_does_not_turn_our_error_into_an_eager_fallback."""

from prelude import *
from steps import *

torch._dynamo.config.suppress_errors = True
cct.enable(timeout=10, exchange="always")  # the recompile is exchanged
f(torch.ones(4, 8))
if RANK == 1:
    cct.disable()
    emit(ev="done")
else:
    try:
        f(torch.ones(6, 8))
        emit(ev="done", error=None, compiles=len(compiles))
    except compiler_collectives.Error as e:
        emit(ev="done", error=e.kind, missing=e.missing_ranks)
