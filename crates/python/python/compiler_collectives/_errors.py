"""The package's exceptions: one class per kind of error of the protocol.

Every error a rank gets from an exchange is an :class:`Error`; the subclass
says which kind (``kind`` holds the same as a string). An error in an
exchange is the same on every rank that takes part in it (docs/failures.md).
"""

from __future__ import annotations

import builtins
from typing import Optional, Sequence, Tuple

__all__ = [
    "Error",
    "Timeout",
    "PeerLost",
    "Desync",
    "VersionMismatch",
    "Disagreement",
    "GraphMismatch",
    "DecodeError",
    "BackendError",
    "InvalidArgument",
    "Unsupported",
    "ChannelUnusable",
    "IncompatibleTorch",
    "PeerCompileFailed",
]


class Error(Exception):
    """An error of compiler_collectives.

    Attributes:
        kind: the machine-readable kind (``"timeout"``, ``"peer_lost"``,
            ``"desync"``, ``"version_mismatch"``, ``"disagreement"``,
            ``"decode"``, ``"backend"``, ``"invalid_argument"``,
            ``"unsupported"``, ``"channel_unusable"``).
        message: the full message (also ``str(error)``), naming the ranks
            and the exchange.
        missing_ranks: for ``Timeout`` and ``PeerLost``, every rank that was
            not in the exchange, ascending; empty otherwise.
        departures: ``(rank, how)`` for the missing ranks known to have left
            (``how`` is ``"shutdown"``, ``"disconnected"`` or ``"aborted"``).
        exchange: the 0-based number of the exchange on this rank's channel
            (guard votes and compile exchanges counted together), or None
            when the error happened outside one.
        key: the compile key of that exchange (for a compile: ``torch.frame
            <module>:<qualname>:<first line>#<compile of that frame>``).
        last_completed: the last exchange every rank completed, or None.
    """

    kind: str = "error"

    def __init__(
        self,
        message: str,
        *,
        missing_ranks: Sequence[int] = (),
        departures: Sequence[Tuple[int, str]] = (),
        exchange: Optional[int] = None,
        key: Optional[str] = None,
        last_completed: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.missing_ranks = list(missing_ranks)
        self.departures = [(int(r), str(how)) for r, how in departures]
        self.exchange = exchange
        self.key = key
        self.last_completed = last_completed

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        # Picklable (multiprocessing, torch.distributed.elastic), keeping fields.
        return (
            _rebuild,
            (
                type(self),
                self.message,
                self.missing_ranks,
                self.departures,
                self.exchange,
                self.key,
                self.last_completed,
            ),
        )


def _rebuild(cls, message, missing_ranks, departures, exchange, key, last_completed):
    return cls(
        message,
        missing_ranks=missing_ranks,
        departures=departures,
        exchange=exchange,
        key=key,
        last_completed=last_completed,
    )


class Timeout(Error, builtins.TimeoutError):
    """Ranks did not arrive before the deadline; ``missing_ranks`` names them."""

    kind = "timeout"


class PeerLost(Error):
    """Ranks left (shut their channel down, disconnected or aborted) while
    this rank waited for them; ``missing_ranks`` names them."""

    kind = "peer_lost"


class Desync(Error):
    """Ranks were at different exchanges: a different compile key (another
    frame, or another compile of it) or sequence number."""

    kind = "desync"


class VersionMismatch(Error):
    """Ranks speak different wire versions of the protocol."""

    kind = "version_mismatch"


class Disagreement(Error):
    """What must be equal on every rank (torch version, Dynamo's
    configuration, options) differs; the message names the ranks and values."""

    kind = "disagreement"


class GraphMismatch(Disagreement):
    """The ranks of a group traced different graphs
    (``enable(check_graphs=True)``), or Inductor's SPMD check found their
    post-grad graphs differ (``spmd_mismatch="error"``). Raised on every rank
    of the group, with the same message: the groups of ranks by graph and
    the first op where they differ.

    Attributes (besides :class:`Error`'s):
        groups: the job ranks of each distinct graph, each group ascending,
            in order of its first rank.
    """

    def __init__(self, message: str, *, groups: Sequence[Sequence[int]] = (), **fields) -> None:
        super().__init__(message, **fields)
        self.groups = [[int(r) for r in g] for g in groups]

    def __reduce__(self):
        return (
            _rebuild_graph_mismatch,
            (self.message, self.groups, self.key, self.exchange, self.last_completed),
        )


def _rebuild_graph_mismatch(message, groups, key, exchange=None, last_completed=None):
    return GraphMismatch(message, groups=groups, key=key, exchange=exchange,
                         last_completed=last_completed)


class DecodeError(Error):
    """A rank's message could not be decoded."""

    kind = "decode"


class BackendError(Error):
    """The transport (Gloo) or the store failed; the message has its text."""

    kind = "backend"


class InvalidArgument(Error, ValueError):
    """An argument, a variable or a call order is wrong. Nothing was sent."""

    kind = "invalid_argument"


class Unsupported(Error):
    """The operation is not supported here."""

    kind = "unsupported"


class ChannelUnusable(Error):
    """An earlier error (or ``disable()``) left the channel unusable."""

    kind = "channel_unusable"


class PeerCompileFailed(Error):
    """``enable(compile_once=True)``: the rank that compiled a graph for this
    one (its owner) raised while compiling it. Raised on every rank that
    waited for it, as soon as the owner's message arrives; the owner raises
    its own exception.

    Attributes (besides :class:`Error`'s):
        owner: the owner's job rank.
        compile_key: the AOTAutograd cache key of the graph.
        exc_type: the owner's exception's class (``module.QualName``).
        exc_message: its message (at most 2000 characters).
    """

    kind = "peer_compile_failed"

    def __init__(self, message: str, *, owner: int = -1, compile_key: str = "",
                 exc_type: str = "", exc_message: str = "", **fields) -> None:
        super().__init__(message, **fields)
        self.owner = int(owner)
        self.compile_key = compile_key
        self.exc_type = exc_type
        self.exc_message = exc_message

    def __reduce__(self):
        return (_rebuild_peer_compile_failed,
                (self.message, self.owner, self.compile_key, self.exc_type, self.exc_message))


def _rebuild_peer_compile_failed(message, owner, compile_key, exc_type, exc_message):
    return PeerCompileFailed(message, owner=owner, compile_key=compile_key, exc_type=exc_type,
                             exc_message=exc_message)


class IncompatibleTorch(Unsupported):
    """``enable()`` refused: the installed torch is not the version, or its
    functions are not the source, this package was written for."""


# Each class reports its public path (``compiler_collectives.Timeout``, as
# tracebacks and ``repr`` print it and pickle finds it), not this module's.
for _cls in (Error, Timeout, PeerLost, Desync, VersionMismatch, Disagreement, GraphMismatch,
             DecodeError, BackendError, InvalidArgument, Unsupported, ChannelUnusable,
             IncompatibleTorch, PeerCompileFailed):
    _cls.__module__ = "compiler_collectives"
del _cls


_CLASSES = {
    cls.__name__: cls
    for cls in (
        Timeout,
        PeerLost,
        Desync,
        VersionMismatch,
        Disagreement,
        DecodeError,
        BackendError,
        InvalidArgument,
        Unsupported,
        ChannelUnusable,
    )
}


#: Core's advice after a fatal error of an exchange, and what it means for a
#: user of this package (which has no ``abort()``: ``disable()`` closes the
#: channel; the job is to be ended and restarted, as docs/failures.md says).
_CORE_ADVICE = "the channel is unusable: abort it"
_PACKAGE_ADVICE = ("the channel is unusable: end the job (or call "
                   "compiler_collectives.torch.disable())")


def _from_native(class_name, kind, message, missing_ranks, exchange, key, last_completed,
                 departures):
    """Builds the exception for a core error (called by the extension, which
    chooses ``class_name`` from core's error kind; ``kind`` is the kind's
    name, which a kind without a class here keeps on the base ``Error``).
    Core's advice "abort it" becomes this package's (end the job, or
    ``disable()``), and the message ends with a period."""
    message = message.replace(_CORE_ADVICE, _PACKAGE_ADVICE)
    if message and not message.endswith("."):
        message += "."
    cls = _CLASSES.get(class_name)
    if cls is None:
        e = _rebuild(Error, message, missing_ranks, departures, exchange, key, last_completed)
        e.kind = kind
        return e
    return _rebuild(cls, message, missing_ranks, departures, exchange, key, last_completed)
