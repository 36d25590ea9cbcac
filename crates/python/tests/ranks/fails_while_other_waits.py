"""The rank program of test_harness.py's failed-rank case: rank 0 says why
it fails on stderr and exits 1; rank 1 waits (as a peer left in a
collective would) until the limit kills it. It needs no process group, so
it skips the prelude."""

import sys
import time

RANK = int(sys.argv[1])
if RANK == 0:
    print("rank 0 fails: the cause of this case", file=sys.stderr, flush=True)
    sys.exit(1)
print("rank 1 waits", flush=True)
time.sleep(3600)
