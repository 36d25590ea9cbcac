"""The rank program of test_ranks.py::test_compiles_in_another_thread_exchange_too."""

from prelude import *
from steps import *

import threading
cct.enable(timeout=30)
worker = threading.Thread(target=run, args=([[4, 4, 4], [5, 6, 7]][RANK],))
worker.start()
worker.join()
emit(ev="done", compiles=compiles, next=cct.channel_info()["next_exchange"])
cct.disable()
