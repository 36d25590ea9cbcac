"""Every rank says why: the out-of-band notice path (docs/python.md, "Every
rank says why").

When an exchange fails on a rank (the error reaches its caller), or the rank
exits on an uncaught exception, it writes one notice into the job's store:
at the root (the store ``enable`` was given, with every ``PrefixStore``
unwrapped), under :func:`notice_key` — the run id, the restart count and
the ``enable`` generation — with ``compare_set``, so the first failure in
the job wins. Every other rank watches that key and, as soon as it is set,
writes its line to stderr, whatever its main thread is doing (a torch
collective, ``backward()``), and logs it at INFO on
``compiler_collectives.notice`` (not WARNING: with no handler configured,
Python's last-resort handler would print it a second time):

- torch's ``TCPStore`` (torchrun, ``env://``): the extension's
  ``NoticeWatcher``, a native thread with its own connection to the store;
- ``FileStore`` (``file://``): a Python thread that checks the key every
  :data:`POLL_S` seconds through the same store object;
- any other store: no watcher, said at INFO when ``enable`` runs.

A job that ends normally writes no notice, so nothing is printed.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import unicodedata
from typing import Optional

log = logging.getLogger("compiler_collectives.notice")

#: The root of the notice keys in the job's store.
KEY_PREFIX = "ccol/notice"
#: How often the FileStore watcher checks the key (seconds); the native
#: watcher waits on it in slices of the same length.
POLL_S = 0.2
#: The longest message a notice carries (characters); longer ones are cut.
MAX_MESSAGE = 600
#: The longest line printed from a notice another rank wrote (characters).
MAX_LINE = 4096


def notice_key(generation: int) -> str:
    """The job's notice key for the ``generation``-th ``enable`` of each
    process: under torchrun's run id and restart count, so a restarted
    attempt never reads an earlier one's notice."""
    return f"{KEY_PREFIX}/{attempt()}/{generation}"


def attempt() -> str:
    """torchrun's run id and restart count, ``<run>/<restart>``: what keeps
    one attempt's store keys apart from an earlier one's."""
    run = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"{run}/{restart}"


def root_store(store):
    """``store`` with every ``PrefixStore`` around it unwrapped."""
    import torch.distributed as dist

    seen = 0
    while isinstance(store, dist.PrefixStore) and seen < 64:
        store = store.underlying_store
        seen += 1
    return store


def _cut(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def failure_line(rank: int, e) -> str:
    """The line every other rank prints for this rank's error ``e`` (an
    exchange's error): the rank, the error's class and kind, the exchange
    number and key, and the message."""
    where = (f"in exchange #{e.exchange} '{e.key}'" if e.exchange is not None
             else "outside an exchange")
    return (f"compiler_collectives: job rank {rank} failed: {type(e).__name__} ({e.kind}) "
            f"{where}: {_cut(e.message)}")


def crash_line(rank: int, kind: type, value, next_exchange: Optional[int]) -> str:
    """The line for a rank that exits on an uncaught exception."""
    # None: its channel closed first (an error, or Ctrl-C during a wait).
    where = ("after its channel closed" if next_exchange is None
             else f"after exchange #{next_exchange - 1}")
    return (f"compiler_collectives: job rank {rank} failed: it is exiting on an uncaught "
            f"{kind.__name__} (crashed) {where}: {_cut(value)}")


def report(value: bytes, own_rank: int) -> None:
    """Prints a notice's line (``<job rank>\\n<line>``) unless this rank
    wrote it, and logs it."""
    text = value.decode("utf-8", errors="replace")
    rank, _, line = text.partition("\n")
    if not line:
        rank, line = "", text
    if rank.strip() == str(own_rank):
        return
    # Another rank wrote it: cut, and no control character (a terminal
    # escape) reaches this rank's terminal.
    line = "".join(" " if unicodedata.category(c) == "Cc" else c for c in line[:MAX_LINE])
    line = " ".join(line.split())
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    log.info("%s", line)


class Notices:
    """One ``enable``'s notice path: posts this rank's failure, watches for
    the others'."""

    def __init__(self, store, rank: int, generation: int, connect_timeout_s: float) -> None:
        import torch.distributed as dist

        self.rank = rank
        self.key = notice_key(generation)
        self.root = root_store(store)
        self.posted = False
        self._native = None
        self._stop = threading.Event()
        if isinstance(self.root, dist.TCPStore):
            from ._native import NoticeWatcher

            self._native = NoticeWatcher(self.root.host, self.root.port, self.key, rank,
                                         connect_timeout_s)
            self.how = "tcpstore"
        elif isinstance(self.root, dist.FileStore):
            threading.Thread(target=self._watch_file, name="ccol-notice", daemon=True).start()
            self.how = "filestore"
        else:
            self.how = None
            logging.getLogger("compiler_collectives.torch").info(
                "compiler_collectives: the job's store is a %s, which the package cannot watch: "
                "another rank's failure will not be reported on this rank (torch's TCPStore and "
                "FileStore are)", type(self.root).__name__,
            )

    def _watch_file(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                if not self.root.check([self.key]):
                    continue
                value = self.root.get(self.key)
            except Exception:  # noqa: BLE001 - the store is gone: the job is ending
                return
            if not self._stop.is_set():
                report(bytes(value), self.rank)
            return

    def post(self, line: str) -> None:
        """Writes this rank's notice, once (the first failure in the job
        wins: later ones are not written)."""
        if self.posted:
            return
        self.posted = True
        try:
            self.root.compare_set(self.key, "", f"{self.rank}\n{line}")
        except Exception as e:  # noqa: BLE001 - the error itself is raised anyway
            log.debug("compiler_collectives: cannot post the notice: %s", e)

    def stop(self) -> None:
        """Stops watching: nothing is printed after this returns (the native
        thread ends within POLL_S)."""
        self._stop.set()
        if self._native is not None:
            self._native.stop()
