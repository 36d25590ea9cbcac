"""The rank program of test_versions.py::test_an_untested_torch_in_a_2_rank_job.

CASE=refused / opt_in: the table (CCOL_TORCH_TABLE) does not know this
torch; enable() without, then with, allow_untested_torch. CASE=disagree: a
known torch, rank 0 passes allow_untested_torch=True and rank 1 False."""

from prelude import *
from steps import count_compiles

import logging

records = []


class Keep(logging.Handler):
    def emit(self, r):
        records.append([r.name, r.levelname, r.getMessage()])


logging.getLogger("compiler_collectives").addHandler(Keep(logging.WARNING))
case = os.environ["CASE"]
allow = case == "opt_in" or (case == "disagree" and RANK == 0)
try:
    cct.enable(timeout=60, allow_untested_torch=allow)
except compiler_collectives.Error as e:
    emit(ev="done", error=e.kind, message=str(e), enabled=cct.is_enabled(), records=records)
    sys.exit(0)
emit(ev="enabled", records=records)
compiles = count_compiles((3, 3, 5, 7))  # it checks each call's sum
emit(ev="done", error=None, compiles=compiles,
     next_exchange=cct.channel_info()["next_exchange"])
cct.disable()
