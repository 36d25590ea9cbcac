"""Which compiles the ranks agree on: ``enable(exchange=..., guard_votes=...)``
and :func:`local` (docs/python.md, "The agreement policy").

Every Dynamo compile (a call of ``convert_frame._compile``, which this
module wraps) is either *exchanged* — its frame exchange, and every
agreement that runs inside it (the cache vote, the partitioner's sync, the
graph checks, distributed autotuning), runs on the channel — or *local*:
none of them runs, and the compile takes this rank's own decisions, as
PyTorch alone does.

Under ``exchange="auto"`` (the default) a compile is exchanged when

1. it is a code object's first compile in this process, reached from code
   every rank runs (not from what a local compile produced: a resume
   function, or a function a locally compiled frame calls), outside
   :func:`local`, and not under compiled autograd (whose graphs each rank
   captures from its own sizes); or
2. guard votes are on (``State.votes_on``) and the guard vote before it
   found that some rank missed, so every rank recompiles together.

Every other compile — a recompile on this rank alone before the job needs
guard votes (a shorter last batch, ``eval()`` or ``no_grad`` on one rank) —
is local, logged at INFO with its reason and counted
(``counters["compiler_collectives"]["local_compile"]``). Under
``exchange="always"`` every compile outside :func:`local` is exchanged, as
PyTorch's own compiler collective does.

Guard votes turn on job-wide (``guard_votes="auto"``) at the first
exchanged compile whose graph holds collectives: each rank computes the bit
from its traced graph (:func:`holds_collectives`), the bit travels in the
frame exchange and is OR-ed across ranks, so every rank turns votes on at
the same exchange.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import sys
import threading
from typing import Iterator, Optional

from . import _state

log = logging.getLogger("compiler_collectives.torch")

#: Dynamo's counters (``torch._dynamo.utils.counters``) under this name.
COUNTERS = "compiler_collectives"

#: How far up the stack a first compile looks for code that a local compile
#: produced (frames).
_MAX_STACK = 256

_tls = threading.local()


class Compile:
    """One Dynamo compile in this thread: whether it is exchanged, why, and
    (exchanged) how many exchanged compiles of its code object came before
    it on this rank — the same on every rank, so it numbers the exchange's
    key."""

    __slots__ = ("exchanged", "reason", "index", "code")

    def __init__(self, exchanged: bool, reason: str, index: int, code) -> None:
        self.exchanged = exchanged
        self.reason = reason
        self.index = index
        self.code = code


class Tracking:
    """What the policy remembers per process while enabled (``State.policy``)."""

    def __init__(self) -> None:
        # id(code) -> code: code objects this process has compiled (a first
        # compile is one whose code is not here). Code objects are kept
        # alive: Dynamo's cache entries hold them anyway.
        self.compiled: dict[int, object] = {}
        # id(code) -> number of exchanged compiles of it so far.
        self.exchanged: dict[int, int] = {}
        # id(code) -> code: what local compiles produced (the transformed
        # code of their cache entries).
        self.local_outputs: dict[int, object] = {}
        # Each compile's mode by its compile id (frame id, compile of that
        # frame, compiled autograd id): AOTAutograd compiles a backward
        # lazily, at the first .backward(), inside the forward's saved
        # CompileContext, where exchanging() finds the forward's mode.
        self.modes: dict[tuple, bool] = {}


def _stack() -> list:
    stack = getattr(_tls, "compiles", None)
    if stack is None:
        stack = _tls.compiles = []
    return stack


def current() -> Optional[Compile]:
    """The compile running in this thread (innermost), or None."""
    stack = _stack()
    return stack[-1] if stack else None


def in_local() -> bool:
    """Whether this thread is inside :func:`local`."""
    return getattr(_tls, "local_depth", 0) > 0


def _compile_key(compile_id) -> Optional[tuple]:
    if compile_id is None:
        return None
    return (getattr(compile_id, "frame_id", None), getattr(compile_id, "frame_compile_id", None),
            getattr(compile_id, "compiled_autograd_id", None))


def exchanging() -> bool:
    """Whether the agreements that run inside a compile take part now, in
    this thread: inside a Dynamo compile, whether it is exchanged; in a
    lazily compiled backward (AOTAutograd's, at the first ``.backward()``,
    maybe on an autograd thread, inside the forward's saved
    ``CompileContext``), whether its forward was; elsewhere, whenever this
    thread is not inside :func:`local`."""
    if getattr(_tls, "alone_depth", 0) > 0:
        return False
    c = current()
    if c is not None:
        return c.exchanged
    if in_local():
        return False
    st = _state.current
    if st is not None and st.policy is not None and st.policy.modes:
        from torch._guards import CompileContext

        mode = st.policy.modes.get(_compile_key(CompileContext.current_compile_id()))
        if mode is not None:
            return mode
    return True


def _reached_from_local_output(tracking: Tracking) -> bool:
    """Whether a frame on this thread's stack runs code that a local compile
    produced."""
    if not tracking.local_outputs:
        return False
    frame = sys._getframe(2)
    for _ in range(_MAX_STACK):
        if frame is None:
            return False
        if id(frame.f_code) in tracking.local_outputs:
            return True
        frame = frame.f_back
    return False


def _decide(st, code, compile_id) -> Compile:
    tracking: Tracking = st.policy
    index = tracking.exchanged.get(id(code), 0)
    first = id(code) not in tracking.compiled
    if in_local():
        return Compile(False, "inside compiler_collectives.torch.local()", index, code)
    if getattr(compile_id, "compiled_autograd_id", None) is not None:
        return Compile(False, "compiled autograd's graph (each rank captures its own)",
                       index, code)
    if st.exchange == "always":
        return Compile(True, "exchange='always'", index, code)
    if first:
        if _reached_from_local_output(tracking):
            return Compile(False, "first reached from code that a local compile produced",
                           index, code)
        return Compile(True, "the code object's first compile", index, code)
    if st.votes_on and getattr(_tls, "vote_missed", False):
        return Compile(True, "a guard vote found a miss: every rank recompiles", index, code)
    if st.votes_on:
        return Compile(False, "a recompile on this rank (its guards missed here, and no "
                              "guard vote missed)", index, code)
    return Compile(False, "a recompile on this rank (its guards missed) before the job "
                          "needs guard votes", index, code)


def make_reset(original):
    """Wraps ``torch._dynamo.reset`` (what ``torch.compiler.reset`` calls):
    Dynamo starts again as a fresh process would, so the policy forgets
    what it remembered (each code object's next compile is a first compile,
    exchanged again). Guard votes stay on once on."""

    def reset(*args, **kwargs):
        result = original(*args, **kwargs)
        st = _state.current
        if st is not None:
            st.policy = Tracking()
        return result

    reset.__wrapped__ = original
    return reset


def _code_name(code) -> str:
    return f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"


def make_compile(original):
    """Wraps ``convert_frame._compile(code, ...)``: decides the compile's
    mode (see the module docs) and keeps it for the compile's duration."""

    def _compile(code, *args, **kwargs):
        st = _state.current
        if st is None:
            return original(code, *args, **kwargs)
        from ._checks import check_switches

        check_switches(st.switches)
        c = _decide(st, code, kwargs.get("compile_id"))
        _tls.vote_missed = False
        tracking: Tracking = st.policy
        tracking.compiled[id(code)] = code
        key = _compile_key(kwargs.get("compile_id"))
        if key is not None:
            tracking.modes[key] = c.exchanged
        if c.exchanged:
            tracking.exchanged[id(code)] = c.index + 1
        else:
            from torch._dynamo.utils import counters

            counters[COUNTERS]["local_compile"] += 1
            log.info("compiler_collectives: local compile of %s: %s", _code_name(code), c.reason)
        stack = _stack()
        stack.append(c)
        try:
            result = original(code, *args, **kwargs)
        except BaseException as e:
            if st.compile_once:
                from . import _compile_once

                _compile_once.abandon(e)
            raise
        finally:
            stack.pop()
        if not c.exchanged:
            guarded = getattr(result, "guarded_code", None)
            out = getattr(guarded, "code", None)
            if out is not None:
                tracking.local_outputs[id(out)] = out
        return result

    _compile.__wrapped__ = original
    return _compile


def make_exceeds_recompile_limit(original):
    """Wraps ``convert_frame.exceeds_recompile_limit(cache_size,
    compile_id)``: for an exchanged compile under ``exchange="auto"``, the
    limits count this rank's exchanged compiles of the code object (the same
    on every rank), not its cache entries (which local compiles add to on
    one rank only)."""

    def exceeds_recompile_limit(cache_size, compile_id):
        st = _state.current
        c = current()
        if st is None or c is None or not c.exchanged or st.exchange == "always":
            return original(cache_size, compile_id)
        import torch._dynamo.config as config

        if c.index >= config.accumulated_recompile_limit:
            return True, "accumulated_recompile_limit"
        if c.index >= config.recompile_limit:
            return True, "recompile_limit"
        return False, ""

    exceeds_recompile_limit.__wrapped__ = original
    return exceeds_recompile_limit


def vote_result(all_hit: bool) -> None:
    """Records this thread's last guard vote: a miss on some rank makes the
    recompile that follows an exchanged one."""
    _tls.vote_missed = not all_hit


@contextlib.contextmanager
def local() -> Iterator[None]:
    """See :func:`compiler_collectives.torch.local`."""
    depth = getattr(_tls, "local_depth", 0)
    snapshot = _UNSET
    if depth == 0 and _state.current is not None:
        snapshot = _snapshot_code_state()
    _tls.local_depth = depth + 1
    log.debug("compiler_collectives: entering local() (depth %d)", depth + 1)
    try:
        yield
    finally:
        _tls.local_depth = depth
        if snapshot is not _UNSET:
            _restore_code_state(snapshot)
        log.debug("compiler_collectives: leaving local() (depth %d)", depth + 1)


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """This thread compiles as a group of one: the agreements that run
    inside a compile stand aside (``exchanging()`` is False), with no change
    to Dynamo's code state. ``compile_once``'s owner compiles so."""
    depth = getattr(_tls, "alone_depth", 0)
    _tls.alone_depth = depth + 1
    try:
        yield
    finally:
        _tls.alone_depth = depth


_UNSET = object()


def _snapshot_code_state():
    """A deep copy of Dynamo's code state (``pgo._CODE_STATE``: every code
    object's automatic-dynamic entries), or None when it is not loaded."""
    import torch._dynamo.pgo as pgo

    state = pgo._CODE_STATE
    return None if state is None else copy.deepcopy(state)


def _restore_code_state(snapshot) -> None:
    import torch._dynamo.pgo as pgo

    pgo._CODE_STATE = snapshot
