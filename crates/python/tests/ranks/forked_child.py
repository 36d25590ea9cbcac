"""The rank program of test_ranks.py::test_a_forked_child_does_not_hang_in_the_package."""

from prelude import *

cct.enable(timeout=10)
pid = os.fork()
if pid == 0:
    enabled = cct.is_enabled()
    cct.disable()
    cct._at_exit()
    os._exit(3 if enabled else 0)
start = time.monotonic()
_, status = os.waitpid(pid, 0)
emit(ev="done", waited=time.monotonic() - start, status=status, enabled=cct.is_enabled())
cct.disable()
