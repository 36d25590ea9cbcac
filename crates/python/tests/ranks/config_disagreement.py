"""The rank program of test_ranks.py::test_ranks_with_different_dynamo_config_disagree_at_enable."""

from prelude import *

torch._dynamo.config.recompile_limit = 8 if RANK == 0 else 4
try:
    cct.enable(timeout=30)
    emit(ev="done", error=None)
except compiler_collectives.Disagreement as e:
    emit(ev="done", error=e.kind, message=str(e), enabled=cct.is_enabled(),
         exchange=e.exchange, key=e.key, last_completed=e.last_completed,
         flag=torch._dynamo.config.enable_compiler_collectives)
