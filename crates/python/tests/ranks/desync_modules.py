"""The rank program of test_ranks.py::test_ranks_compiling_different_modules_get_a_desync_error."""

from prelude import *

cct.enable(timeout=10)
a = torch.compile(torch.nn.Linear(4, 2), backend="eager")
b = torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), backend="eager")
try:
    (a if RANK == 0 else b)(torch.ones(3, 4))
    emit(ev="done", error=None)
except compiler_collectives.Error as e:
    emit(ev="done", error=e.kind, message=str(e))
