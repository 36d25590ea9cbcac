"""The job of test_harness.py's torchrun-like case: it starts a worker in a
session of its own (as torchrun starts its ranks), writes the worker's pid
to argv[1], says "started", and sleeps; so does the worker."""

import os
import subprocess
import sys
import time

worker = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(worker.pid))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
print("started", flush=True)
time.sleep(600)
