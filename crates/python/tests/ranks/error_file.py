"""The rank program of test_ranks.py::test_an_error_reaching_the_caller_is_written_to_the_torchelastic_error_file."""

from prelude import *
from steps import *

cct.enable(timeout=10, exchange="always")  # the recompile is exchanged
f(torch.ones(4, 8))
if RANK == 1:
    cct.disable()
else:
    f(torch.ones(6, 8))   # raises PeerLost, uncaught: the process exits 1
