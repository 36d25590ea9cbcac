"""The rank program of test_harness.py's flood case: rank 1 writes about
4.5 MB to stderr (some 70 pipe buffers) before a barrier that rank 0 waits
in. Read one process after another, rank 1 blocks on its full pipe while
rank 0 waits at the barrier: both stop until the process group's timeout."""

from prelude import *

if RANK == 1:
    line = b"rank 1 says " + b"y" * 100 + b"\n"
    for _ in range(40000):
        os.write(2, line)
dist.barrier()
emit(ev="done")
