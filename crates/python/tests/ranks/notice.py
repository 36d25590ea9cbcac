"""The rank program of test_policy.py's notice tests: rank 0 compiles h
alone, outside local(), and gets a Timeout naming rank 1; rank 1 sits in a
torch all-reduce meanwhile (rank 0 never joins it) and must say why the job
fails before Gloo's error ends it. Rank 1's stderr goes through a pipe read
on a thread, so each line's arrival time is known (wall clock, comparable
across the two processes of one machine).

Events: rank 0 "error" (the Timeout, and when its exchange began); rank 1
"collective" (what ended the all-reduce, and the notice lines with their
arrival times)."""

import threading

from prelude import *
from steps import *

TIMEOUT = float(os.environ.get("CCOL_POLICY_TIMEOUT", "3"))
lines = []

if RANK == 1:
    # fd 2 -> a pipe; a thread timestamps each line and passes it on.
    original = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def tee():
        with os.fdopen(read_end, "rb", buffering=0) as r:
            pending = b""
            while True:
                chunk = r.read(65536)
                if not chunk:
                    return
                os.write(original, chunk)
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    lines.append((time.time(), line.decode(errors="replace")))

    threading.Thread(target=tee, daemon=True).start()

cct.enable(timeout=TIMEOUT)


@torch.compile(backend=backend)
def h(x):
    return (x + 1).sum()


f(torch.ones(4, 8))
if RANK == 0:
    began = time.time()
    try:
        h(torch.ones(4, 8))
        emit(ev="error", kind=None)
    except compiler_collectives.Error as e:
        emit(ev="error", kind=e.kind, missing=e.missing_ranks, exchange=e.exchange, key=e.key,
             message=str(e), began=began, ended=time.time())
    sys.exit(0)
else:
    began = time.time()
    try:
        dist.all_reduce(torch.ones(2))
        ended_by = None
    except Exception as e:  # noqa: BLE001 - Gloo's error once rank 0 is gone
        ended_by = f"{type(e).__name__}: {e}"[:300]
    time.sleep(0.5)
    notices = [(t, l) for t, l in lines if l.startswith("compiler_collectives: job rank")]
    emit(ev="collective", began=began, ended_by=ended_by, notices=notices)
    os._exit(0)
