"""The rank program of test_ranks.py::test_guard_votes_make_every_rank_recompile_when_one_misses."""

from prelude import *
from steps import *

cct.enable(timeout=30, guard_votes=True)
torch._dynamo.config.enable_compiler_collectives = False
run([[10, 10], [10, 12]][RANK])
emit(ev="done", compiles=compiles)
cct.disable()
