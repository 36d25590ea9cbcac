"""The rank program of test_ranks.py::test_an_explicit_timeout_ignores_ccol_timeout_s."""

from prelude import *
from steps import *

cct.enable(timeout=10)
run([4, 4])
emit(ev="done", timeout=cct.channel_info()["timeout_s"], compiles=len(compiles))
cct.disable()
