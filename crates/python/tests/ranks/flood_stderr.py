"""The rank program of test_harness.py's limit case: rank 1, and a child it
forks, write to stderr without end; rank 0 exits at once. It needs no
process group, so it skips the prelude (and torch's import time)."""

import os
import sys

RANK, STORE = int(sys.argv[1]), sys.argv[3]
if RANK == 1:
    who = "child" if os.fork() == 0 else "rank 1"
    pid_file = os.path.join(os.path.dirname(STORE), f"pid-{who.replace(' ', '')}")
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pid_file + ".tmp", pid_file)
    line = (f"flood from {who}: " + "x" * 100 + "\n").encode()
    while True:
        os.write(2, line)
print('EVENT {"ev": "done"}', flush=True)
