"""torch.compile's compiler collectives and guard votes on the compiler-collectives protocol.

Call :func:`enable` once on every rank, after ``init_process_group``::

    import compiler_collectives.torch
    compiler_collectives.torch.enable(timeout=120)

What it replaces in Dynamo (torch 2.13; docs/torch-compile.md):

- ``OutputGraph.run_compiler_collective``: the ``all_gather_object`` of the
  frame's ``LocalState`` on Dynamo's compile group becomes one exchange on
  this package's channel — one round when every rank saw the same or the
  states are small (a 4096-byte slot), no pickling, a deadline, a key naming
  the frame (ranks compiling
  different frames get :class:`~compiler_collectives.Desync`). Dynamo keeps
  the rest: the restart, and applying every rank's state in rank order
  (``pgo.process_automatic_dynamic``).
- ``get_compile_pg`` (where ``convert_frame`` and ``distributed`` look it
  up): returns this package's group, so Dynamo never creates a process group
  of its own. It follows Dynamo's rule: only while
  ``torch._dynamo.config.enable_compiler_collectives`` is on (``enable``
  turns it on; turning it off afterwards leaves guard votes alone).
- with ``guard_votes=True``, the guard-complete hook
  (``torch.compiler.set_enable_guard_collectives``): one vote per call of a
  frame that has compiled entries; any rank's miss makes every rank
  recompile. ``eval_frame.guard_collectives_hook`` is replaced as well, so
  ``torch.compiler.set_enable_guard_collectives(True)`` installs this vote.
- ``CatchErrorsWrapper.__call__`` (the callback Dynamo's frame evaluation
  calls) is wrapped, so that this package's errors reach the caller as
  themselves — not as Dynamo's ``InternalTorchDynamoError``, never as an
  eager fallback (``suppress_errors``) and never as a process abort (a
  failed guard vote votes "miss" and raises on the recompile that follows).

The channel is a Gloo process group of this package's own (Rust, CPU,
TCP), rendezvoused through the default process group's store; no collective
runs on a torch process group. Its deadline: ``timeout``, else
``CCOL_TIMEOUT_S``, else 300 s. Under torchrun, an error that reaches the
caller is also written to ``TORCHELASTIC_ERROR_FILE``.
"""

from __future__ import annotations

import atexit
import datetime
import hashlib
import inspect
import json
import logging
import math
import os
import socket
import sys
import textwrap
import time
import traceback
from typing import Callable, Optional, Union

import torch
import torch.distributed as dist

from ._errors import ChannelUnusable, Error, IncompatibleTorch, InvalidArgument

__all__ = ["enable", "disable", "is_enabled", "channel_info", "TORCH_VERSION"]

log = logging.getLogger(__name__)

#: The torch version this module was written for.
TORCH_VERSION = "2.13.0"

#: sha256 of ``textwrap.dedent(inspect.getsource(f))`` of each torch function
#: this module replaces or depends on, as installed with torch 2.13.0.
_SOURCES = {
    "torch._dynamo.output_graph.OutputGraph.run_compiler_collective": (
        "580d543628bed01d63b8776f3bc5e4e02d1059b2d832ee060d0e805507db2da6"
    ),
    "torch._dynamo.eval_frame.guard_collectives_hook": (
        "0bcf4590ae39d1bffdf595a5c61ca5670955d04f8d245a9d06d4b41d5ae25bd0"
    ),
    "torch._dynamo.distributed.get_compile_pg": (
        "c4d0a9ebb378acc0b87464fa76a56cc3198ad27587e10f1a7b01911f3701ba4d"
    ),
    "torch._dynamo.convert_frame.CatchErrorsWrapper.__call__": (
        "03695994d74f8125b6e4a74280ebd6032de6e6d7af4ebb352e8d876b521c364f"
    ),
    "torch._dynamo.pgo.process_automatic_dynamic": (
        "cb44ecf7b9a27abed9c15fb07045806ea482e0e354686b4a7822d3cedb824a64"
    ),
}

#: The compile key of a guard vote (fixed: every rank's k-th vote is the same
#: decision point).
GUARD_VOTE_KEY = "torch.guard_vote"
#: The compile key of the check ``enable`` runs.
ENABLE_KEY = "torch.enable"
#: Longest frame key sent (bytes); longer ones keep their start and a digest.
_MAX_KEY = 1024
_DEFAULT_TIMEOUT_S = 300.0


class _Group:
    """What ``get_compile_pg`` returns while enabled: a stand-in for Dynamo's
    compile group (``DistributedState.compile_pg``), never a torch process
    group. Only this package's ``run_compiler_collective`` uses it."""

    def __init__(self, channel) -> None:
        self.channel = channel

    def rank(self) -> int:
        return self.channel.rank

    def size(self) -> int:
        return self.channel.world_size

    def __repr__(self) -> str:
        return f"compiler_collectives.torch group ({self.channel!r})"


class _State:
    def __init__(self, channel, guard_votes: bool) -> None:
        self.channel = channel
        self.group = _Group(channel)
        self.guard_votes = guard_votes
        # The first error of an exchange that has not reached the caller yet
        # (a failed guard vote, or one Dynamo suppressed).
        self.pending: Optional[BaseException] = None
        self.restore: list[Callable[[], None]] = []
        self.pid = os.getpid()
        # An uncaught exception is on its way out of the process: at exit the
        # channel aborts (peers see this rank lost), it does not say "no
        # more exchanges".
        self.crashed = False


_state: Optional[_State] = None
_generation = 0
_hooks_registered = False


# --------------------------------------------------------------------------
# What enable checks
# --------------------------------------------------------------------------


def _resolve(path: str):
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = __import__(".".join(parts[:i]), fromlist=["_"])
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def _check_torch() -> None:
    """Raises IncompatibleTorch unless torch and the replaced functions are
    the ones this module was written for."""
    version = torch.__version__.split("+")[0]
    if version != TORCH_VERSION:
        raise IncompatibleTorch(
            f"compiler_collectives.torch was written for torch {TORCH_VERSION}; this is torch "
            f"{torch.__version__}. Dynamo's compiler collectives were left as they are."
        )
    changed = []
    for path, digest in _SOURCES.items():
        try:
            src = textwrap.dedent(inspect.getsource(_resolve(path)))
        except (ImportError, AttributeError, OSError, TypeError) as e:
            changed.append(f"{path} (cannot read its source: {e})")
            continue
        if hashlib.sha256(src.encode()).hexdigest() != digest:
            changed.append(f"{path} (its source differs)")
    if changed:
        raise IncompatibleTorch(
            "compiler_collectives.torch refuses to replace what it was not written for: "
            + "; ".join(changed)
            + f". It was written for torch {TORCH_VERSION}'s own source; Dynamo's compiler "
            "collectives were left as they are."
        )


def _timeout_seconds(timeout: Union[None, float, int, datetime.timedelta]) -> float:
    if timeout is None:
        text = os.environ.get("CCOL_TIMEOUT_S", "")
        if not text:
            return _DEFAULT_TIMEOUT_S
        from ._native import parse_timeout_secs

        # Core's parser, as every tool of the project reads the variable.
        try:
            value = parse_timeout_secs(text)
        except InvalidArgument as e:
            raise InvalidArgument(f"CCOL_TIMEOUT_S={text!r}: {e}") from None
        what = f"CCOL_TIMEOUT_S={text!r}"
    elif isinstance(timeout, datetime.timedelta):
        value, what = timeout.total_seconds(), f"timeout={timeout!r}"
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        value, what = float(timeout), f"timeout={timeout!r}"
    else:
        raise InvalidArgument(
            f"timeout must be seconds (a number) or a datetime.timedelta, not {timeout!r}"
        )
    if not (math.isfinite(value) and value > 0):
        raise InvalidArgument(f"{what}: the deadline must be a finite, positive number of seconds")
    return value


def _hostname() -> str:
    """The address peers connect to for this rank's Gloo pairs."""
    explicit = os.environ.get("CCOL_GLOO_HOSTNAME")
    if explicit:
        return explicit
    world, local = os.environ.get("WORLD_SIZE"), os.environ.get("LOCAL_WORLD_SIZE")
    master = os.environ.get("MASTER_ADDR", "")
    if (world is None or world == local) or master in ("", "localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    # Several nodes: the local address of the route to MASTER_ADDR (no packet
    # is sent; a UDP connect only picks the route).
    try:
        port = int(os.environ.get("MASTER_PORT", "29500"))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, port))
            return s.getsockname()[0]
    except (OSError, ValueError):
        return socket.gethostname()


#: Dynamo and fx settings that shape automatic-dynamic and recompile
#: decisions: must be equal on every rank.
_CONFIG = [
    ("torch._dynamo.config", "automatic_dynamic_shapes"),
    ("torch._dynamo.config", "automatic_dynamic_shapes_mark_as"),
    ("torch._dynamo.config", "assume_static_by_default"),
    ("torch._dynamo.config", "specialize_int"),
    ("torch._dynamo.config", "specialize_float"),
    ("torch._dynamo.config", "force_parameter_static_shapes"),
    ("torch._dynamo.config", "force_nn_module_property_static_shapes"),
    ("torch._dynamo.config", "allow_unspec_int_on_nn_module"),
    ("torch._dynamo.config", "capture_scalar_outputs"),
    ("torch._dynamo.config", "capture_dynamic_output_shape_ops"),
    ("torch._dynamo.config", "recompile_limit"),
    ("torch._dynamo.config", "accumulated_recompile_limit"),
    ("torch._dynamo.config", "enable_compiler_collectives"),
    ("torch.fx.experimental._config", "use_duck_shape"),
]


def _must_agree(guard_votes: bool) -> str:
    from ._native import VERSION, WIRE_VERSION

    fields = [
        f"torch={torch.__version__}",
        f"compiler_collectives={VERSION}",
        f"wire={WIRE_VERSION}",
        f"guard_votes={guard_votes}",
    ]
    for module, name in _CONFIG:
        try:
            value = getattr(_resolve(module), name)
        except (ImportError, AttributeError):
            value = "<absent>"
        fields.append(f"{module.rsplit('.', 1)[-1]}.{name}={value!r}")
    return "\n".join(fields)


# --------------------------------------------------------------------------
# The replacements
# --------------------------------------------------------------------------


def _frame_key(tx) -> str:
    """The compile key of a frame's exchange: portable across hosts (no file
    path) and distinct per compile of the frame."""
    code = tx.f_code
    module = tx.f_globals.get("__name__", "?") if hasattr(tx, "f_globals") else "?"
    qualname = getattr(code, "co_qualname", code.co_name)
    from torch._guards import CompileContext

    compile_id = CompileContext.current_compile_id()
    count = getattr(compile_id, "frame_compile_id", None)
    wrapped = _wrapped(tx) if module.startswith("torch.") else ""
    key = f"torch.frame {module}:{qualname}:{code.co_firstlineno}{wrapped}#{count}"
    if len(key.encode()) > _MAX_KEY:
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        key = key.encode()[: _MAX_KEY - 20].decode(errors="ignore") + f"…{digest}"
    return key


def _wrapped(tx) -> str:
    """What a torch wrapper frame calls (``torch.compile(module)`` compiles
    ``external_utils.wrap_inline``'s ``inner`` for every module): the names
    of the classes or functions in its closure, ``[Linear]``, so that ranks
    compiling different modules do not share a key."""
    names = []
    for cell in getattr(tx, "closure", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        target = getattr(value, "__self__", value)
        if isinstance(target, torch.nn.Module) or not callable(target):
            names.append(type(target).__qualname__)
        else:
            names.append(getattr(target, "__qualname__", type(target).__qualname__))
    return f"[{','.join(names)}]" if names else ""


def _make_run_compiler_collective(original):
    from torch._dynamo import exc
    from torch._dynamo.utils import dynamo_timed

    def run_compiler_collective(self) -> None:
        tx = self.root_tx
        if tx is None:
            raise AssertionError("root_tx must not be None")
        ds = tx.distributed_state
        if ds is None or ds.all_states is not None:
            return
        st = _state
        if st is None or ds.compile_pg is not st.group:
            # A frame whose compile began before enable() (or after
            # disable()) with a group of Dynamo's own.
            return original(self)
        log.info("compiler_collective %s", ds.local_state)
        torch._logging.trace_structured(
            "artifact",
            metadata_fn=lambda: {"name": "compiler_collective", "encoding": "string"},
            payload_fn=lambda: ds.local_state.render(),
        )
        with dynamo_timed("compiler_collective", log_pt2_compile_event=True):
            try:
                ds.all_states = st.channel.exchange_local_state(_frame_key(tx), ds.local_state)
            except Error as e:
                st.pending = e
                raise
        # As Dynamo does: tracing may diverge with what the exchange said.
        tx.speculation_log.clear()
        raise exc.CompileCollectiveRestartAnalysis

    run_compiler_collective.__wrapped__ = original
    return run_compiler_collective


def _collectives_on() -> bool:
    """Whether compile exchanges are on for a compile in this thread.

    Dynamo's settings are per thread in torch 2.13 (a user's value is a
    ``ContextVar``): what ``enable()`` set in its caller's thread reads as the
    default (off) in every other thread. A compile in another thread must
    exchange all the same, or ranks diverge: so the flag counts only where
    it was set in this thread (the way to turn exchanges off), and is on
    otherwise while the package is enabled."""
    try:
        from torch.utils._config_module import _UNSET_SENTINEL

        entry = torch._dynamo.config._config["enable_compiler_collectives"]
        value = entry.user_override.get()
    except (ImportError, AttributeError, KeyError, LookupError):
        return bool(torch._dynamo.config.enable_compiler_collectives)
    return True if value is _UNSET_SENTINEL else bool(value)


def _get_compile_pg():
    st = _state
    if st is not None and _collectives_on():
        return st.group
    return None


def _guard_vote(guard_eval_result: bool) -> bool:
    """The guard-complete hook: True when every rank's guards hit. Never
    raises (an exception here aborts the process): a failure votes "miss",
    and the recompile that follows raises it."""
    st = _state
    if st is None:
        return guard_eval_result
    if st.pending is not None:
        return False
    try:
        return st.channel.vote_all_hit(GUARD_VOTE_KEY, bool(guard_eval_result))
    except BaseException as e:  # noqa: BLE001 - raised on the recompile path
        st.pending = e
        return False


def _ours(e: BaseException) -> Optional[BaseException]:
    """This package's error in e's chain (Dynamo re-raises ``from None``,
    keeping the original only as ``__context__``)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, Error):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _report(e: BaseException) -> None:
    """Writes e to TORCHELASTIC_ERROR_FILE, as torchrun's ``@record`` would."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {
        "message": {
            "message": f"{type(e).__name__}: {e}",
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(type(e), e, e.__traceback__)),
                "timestamp": str(int(time.time())),
            },
        }
    }
    try:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError as io:
        log.warning("cannot write the torchelastic error file %s: %s", path, io)


def _surface(e: BaseException):
    """Raises e (an error of an exchange) to the caller of the compiled code."""
    st = _state
    if st is not None and st.pending is e:
        st.pending = None
    if isinstance(e, Error):
        _report(e)
    # Dynamo's InternalTorchDynamoError wrapping it says nothing more.
    raise e.with_traceback(e.__traceback__) from None


def _make_catch_errors_call(original):
    def __call__(self, frame, cache_entry, frame_state):
        st = _state
        if st is not None and st.pending is not None:
            _surface(st.pending)
        try:
            result = original(self, frame, cache_entry, frame_state)
        except BaseException as e:
            ours = _ours(e)
            if ours is None:
                raise
            _surface(ours)
        st = _state
        if st is not None and st.pending is not None:
            # Dynamo suppressed it (config.suppress_errors) and would run eager.
            _surface(st.pending)
        return result

    __call__.__wrapped__ = original
    return __call__


# --------------------------------------------------------------------------
# enable / disable
# --------------------------------------------------------------------------


def _patch(st: _State, owner, name: str, value) -> None:
    old = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, value)
    st.restore.append(lambda: setattr(owner, name, old))


def _connect(channel_type, store, timeout_s: float, pgo, local_state_type):
    return channel_type(
        store,
        dist.get_rank(),
        dist.get_world_size(),
        prefix=f"ccol/torch/{_generation}",
        timeout_s=timeout_s,
        hostname=_hostname(),
        pgo=pgo,
        local_state_type=local_state_type,
    )


def enable(
    *,
    timeout: Union[None, float, int, datetime.timedelta] = None,
    guard_votes: bool = False,
) -> None:
    """Puts Dynamo's compiler collectives (and, with ``guard_votes``, its
    guard collectives) on this package's channel. Call it on every rank,
    after ``torch.distributed.init_process_group`` and before the first
    compiled call; ranks must pass the same ``guard_votes``.

    Args:
        timeout: the deadline of the rendezvous and of every exchange, in
            seconds or as a ``timedelta``; default ``CCOL_TIMEOUT_S``, else
            300 s.
        guard_votes: also take a guard vote per call of a frame with
            compiled entries (``torch.compiler.set_enable_guard_collectives``
            semantics: any rank's miss makes every rank recompile).

    Turns ``torch._dynamo.config.enable_compiler_collectives`` on
    (``disable`` restores it). Costs one rendezvous through the default
    group's store, then one check that every rank has the same torch
    version, Dynamo configuration (automatic dynamic shapes, recompile
    limits, …), wire version and ``guard_votes``.

    Raises:
        IncompatibleTorch: torch is not 2.13.0, or a function this module
            replaces has another source (nothing is changed).
        InvalidArgument: no default process group, already enabled, or a bad
            timeout.
        Timeout: a rank did not come to the rendezvous within the deadline
            (the message names it).
        Disagreement: ranks differ in what must be equal (names the ranks
            and values).
    """
    global _state, _generation, _hooks_registered
    if _state is not None:
        raise InvalidArgument(
            "compiler_collectives.torch is already enabled; call disable() first"
        )
    _check_torch()
    if not isinstance(guard_votes, bool):
        raise InvalidArgument(f"guard_votes must be a bool, not {guard_votes!r}")
    timeout_s = _timeout_seconds(timeout)
    if not (dist.is_available() and dist.is_initialized()):
        raise InvalidArgument(
            "compiler_collectives.torch.enable() needs the default process group: call "
            "torch.distributed.init_process_group(...) first"
        )
    import torch._dynamo.convert_frame as convert_frame
    import torch._dynamo.distributed as dynamo_distributed
    import torch._dynamo.eval_frame as eval_frame
    import torch._dynamo.output_graph as output_graph
    import torch._dynamo.pgo as pgo
    from torch._C._dynamo.eval_frame import set_guard_complete_hook
    from torch._dynamo.symbolic_convert import LocalState

    from ._native import CompileChannel

    store = dist.distributed_c10d._get_default_store()
    _generation += 1
    try:
        channel = _connect(CompileChannel, store, timeout_s, pgo, LocalState)
    except Error as e:
        _report(e)
        raise
    st = _State(channel, guard_votes)

    previous_flag = torch._dynamo.config.enable_compiler_collectives
    torch._dynamo.config.enable_compiler_collectives = True
    st.restore.append(
        lambda: setattr(torch._dynamo.config, "enable_compiler_collectives", previous_flag)
    )
    try:
        channel.agree(ENABLE_KEY, _must_agree(guard_votes))
    except BaseException as e:
        for undo in reversed(st.restore):
            undo()
        channel.abort()
        if isinstance(e, Error):
            _report(e)
        raise
    og = output_graph.OutputGraph
    _patch(st, og, "run_compiler_collective",
           _make_run_compiler_collective(og.__dict__["run_compiler_collective"]))
    _patch(st, dynamo_distributed, "get_compile_pg", _get_compile_pg)
    _patch(st, convert_frame, "get_compile_pg", _get_compile_pg)
    cew = convert_frame.CatchErrorsWrapper
    _patch(st, cew, "__call__", _make_catch_errors_call(cew.__dict__["__call__"]))
    _patch(st, eval_frame, "guard_collectives_hook", _guard_vote)
    if guard_votes:
        previous_hook = set_guard_complete_hook(_guard_vote)
        st.restore.append(lambda: set_guard_complete_hook(previous_hook))
    previous_excepthook = sys.excepthook

    def excepthook(kind, value, tb):
        st.crashed = True
        previous_excepthook(kind, value, tb)

    sys.excepthook = excepthook
    st.restore.append(lambda: setattr(sys, "excepthook", previous_excepthook))
    _state = st
    if not _hooks_registered:
        atexit.register(_at_exit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_forget_in_child)
        _hooks_registered = True


def disable() -> None:
    """Restores everything ``enable`` replaced and shuts the channel down
    (ranks still waiting on this one get ``PeerLost`` naming it). Does
    nothing when not enabled."""
    global _state
    st = _state
    if st is None:
        return
    _state = None
    for undo in reversed(st.restore):
        undo()
    if st.pid != os.getpid():
        # A forked child: the channel is the parent's.
        st.channel.forget_after_fork()
        return
    try:
        st.channel.shutdown()
    except ChannelUnusable:
        # An earlier error already closed it (and was raised then).
        pass


def is_enabled() -> bool:
    """Whether :func:`enable` is in effect."""
    return _state is not None


def channel_info() -> Optional[dict]:
    """The channel's rank, world size, deadline (seconds), store and next
    exchange number, or None when not enabled."""
    st = _state
    if st is None:
        return None
    c = st.channel
    return {
        "rank": c.rank,
        "world_size": c.world_size,
        "timeout_s": c.timeout_s,
        "store": c.store,
        "next_exchange": c.next_exchange,
        "guard_votes": st.guard_votes,
    }


def _at_exit() -> None:
    # Tell the other ranks this one has no more exchanges, so that a rank
    # still waiting gets PeerLost naming it, not a timeout; after an uncaught
    # exception, abort instead (they see this rank lost, not finished).
    st = _state
    try:
        if st is not None and st.crashed and st.pid == os.getpid():
            st.channel.abort()
        disable()
    except Exception as e:  # noqa: BLE001 - exiting anyway
        log.debug("compiler_collectives: shutdown at exit: %s", e)


def _forget_in_child() -> None:
    # A process forked from a rank is not a rank: its copy of the channel
    # (whose Gloo threads did not survive the fork) is never used or closed.
    global _state
    st = _state
    if st is not None:
        _state = None
        st.channel.forget_after_fork()

