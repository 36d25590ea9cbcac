"""The rank program of test_ranks.py::test_a_rank_waiting_in_an_exchange_lets_its_other_threads_run."""

from prelude import *
from steps import *

import threading
ticks = [0]
stop = threading.Event()
def count():
    while not stop.is_set():
        ticks[0] += 1
        time.sleep(0.01)
cct.enable(timeout=30)
if RANK == 1:
    time.sleep(2)
counter = threading.Thread(target=count)
counter.start()
start = time.monotonic()
before = ticks[0]
f(torch.ones(4, 8))
waited = time.monotonic() - start
during = ticks[0] - before
stop.set()
counter.join()
emit(ev="done", waited=waited, during=during)
cct.disable()
