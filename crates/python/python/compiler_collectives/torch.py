"""torch.compile's compiler collectives and guard votes on the compiler-collectives protocol.

Call :func:`enable` once on every rank, after ``init_process_group``::

    import compiler_collectives.torch
    compiler_collectives.torch.enable(timeout=120)

What it replaces in Dynamo (torch 2.11 to 2.15; docs/torch-compile.md). Which
torch versions it was tested with, and what it checks in them, is data:
``_torch_table.json`` (``scripts/torch-table.py`` regenerates it; the checks
are in ``_compat.py``).

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

- PT2's other compile-time agreements (``_cache_vote``, ``_partitioner``,
  ``_autotune``, ``_graph_check``): AOTAutograd's cache-hit vote
  (``cache_agreement=True``), the partitioner's decision sync, Inductor's
  distributed autotuning, its SPMD check, and the graph check
  (``check_graphs=True``): docs/python.md, "Every agreement".

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
import json
import logging
import math
import os
import sys
import time
import traceback
from typing import Callable, Optional, Union

import torch
import torch.distributed as dist

from . import _autotune, _cache_vote, _compat, _graph_check, _partitioner
from ._errors import ChannelUnusable, Error, IncompatibleTorch, InvalidArgument, Unsupported

__all__ = ["enable", "disable", "is_enabled", "channel_info", "TORCH_VERSION", "TORCH_VERSIONS"]

log = logging.getLogger(__name__)

#: The torch versions this module was tested with: those of its table
#: (``_torch_table.json``), oldest first. A torch whose every entry matches one
#: of them is accepted, whatever its version string; any other is refused
#: unless ``enable(allow_untested_torch=True)``.
TORCH_VERSIONS = tuple(
    sorted(_compat.load_table(_compat.DEFAULT_TABLE)["versions"],
           key=lambda v: _compat.release(v) or ())
)
#: The newest of them.
TORCH_VERSION = TORCH_VERSIONS[-1]

# What is checked in torch (formerly the digests of 5 functions here) is the
# table's "entries": every function, class, field, call site and setting this
# module replaces, wraps or relies on.

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
    def __init__(self, channel, guard_votes: bool, cache_agreement: bool = False,
                 check_graphs: bool = False) -> None:
        self.channel = channel
        self.group = _Group(channel)
        self.guard_votes = guard_votes
        self.cache_agreement = cache_agreement
        self.check_graphs = check_graphs
        # The first error of an exchange that has not reached the caller yet
        # (a failed guard vote, or one Dynamo suppressed).
        self.pending: Optional[BaseException] = None
        self.restore: list[Callable[[], None]] = []
        self.pid = os.getpid()
        # An uncaught exception is on its way out of the process: at exit the
        # channel aborts (peers see this rank lost), it does not say "no
        # more exchanges".
        self.crashed = False
        # The job ranks of the channel's members, ascending (enable's group).
        self.ranks: list[int] = []


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


def _check_torch(allow_untested: bool = False) -> "_compat.Decision":
    """Which tested torch this one is (every table entry equal to that
    version's), read from the installed torch's source and its live objects.

    Raises IncompatibleTorch naming the version and each entry that differs
    from the nearest tested version; with ``allow_untested``, logs one
    warning instead and follows that version, unless a required entry is
    missing or cannot be called as this module calls it. Changes nothing."""
    try:
        table = _compat.load_table()
    except (OSError, ValueError) as e:
        raise IncompatibleTorch(
            f"compiler_collectives.torch cannot read its torch table {_compat.table_path()}: "
            f"{e}. Nothing was changed."
        ) from None
    root = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))
    observed, sites = _compat.observe_cached(root, table["entries"])
    problems = {}
    for path, entry in table["entries"].items():
        if observed[path] is not None:
            why = _compat.live_problem(root, path, entry, known=observed[path] is True,
                                       site=sites.get(path))
            if why is not None:
                problems[path] = why
    try:
        decision = _compat.decide(table, observed, problems, torch.__version__, allow_untested)
    except _compat.Refusal as e:
        raise IncompatibleTorch(str(e)) from None
    if decision.warning is not None:
        log.warning("%s", decision.warning)
    return decision


#: The table entries each agreement replaces or wraps: an agreement is
#: installed when the followed torch version has every entry of its list.
_AGREEMENT_ENTRIES = {
    "cache_vote_before_2_15": [
        "torch._functorch._aot_autograd.autograd_cache.AOTAutogradCache.try_load",
        "torch._functorch._aot_autograd.autograd_cache.AOTAutogradCache._lookup",
    ],
    "cache_vote_2_15": [_cache_vote.SYNC_PATH],
    "partitioner": [
        "torch._functorch.partitioners._sync_decision_cross_ranks",
        "torch._functorch.partitioners._canonical_node_names",
        "torch._functorch.partitioners._size_of",
    ],
    "autotune": [
        "torch._inductor.distributed_autotune.get_autotune_pg",
        "torch._inductor.distributed_autotune._sync",
        "torch._inductor.distributed_autotune.maybe_autotune_remote",
        "torch._inductor.distributed_autotune._SerializedChoice",
    ],
    "graph_check": ["torch._dynamo.output_graph.OutputGraph.call_user_compiler"],
    "spmd_check": [
        "torch._inductor.fx_passes.spmd_check.spmd_check",
        "torch._inductor.fx_passes.spmd_check._compute_hash",
        "torch._inductor.fx_passes.spmd_check._build_diag_fingerprint",
        "torch._inductor.fx_passes.spmd_check._build_mismatch_report",
    ],
}


def _available(version: str) -> set:
    """The agreements of ``_AGREEMENT_ENTRIES`` torch ``version`` (a table
    version) has every entry of."""
    known = _compat.load_table()["versions"][version]
    return {name for name, paths in _AGREEMENT_ENTRIES.items() if all(known.get(p) for p in paths)}


def _check_agreements(cache_agreement: bool, check_graphs: bool, available: set) -> None:
    """What ``enable`` refuses about the agreements (nothing changed yet)."""
    for name, value in (("cache_agreement", cache_agreement), ("check_graphs", check_graphs)):
        if not isinstance(value, bool):
            raise InvalidArgument(f"{name} must be a bool, not {value!r}")
    if cache_agreement and not available & {"cache_vote_before_2_15", "cache_vote_2_15"}:
        raise Unsupported(
            f"cache_agreement=True: torch {torch.__version__} lacks the AOTAutogradCache "
            "functions it hooks into (see the version table). Nothing was changed."
        )
    if check_graphs and "graph_check" not in available:
        raise Unsupported(
            f"check_graphs=True: torch {torch.__version__} lacks "
            "OutputGraph.call_user_compiler. Nothing was changed."
        )
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    for flag, needs in (("_sync_decision_cross_ranks", {"partitioner"}),
                        (_cache_vote.TORCH_FLAG, {"cache_vote_2_15"})):
        if getattr(functorch_config, flag, False) and not available & needs:
            raise Unsupported(
                f"torch._functorch.config.{flag} is on, and torch {torch.__version__} lacks "
                "what the package runs that sync through (see the version table): its "
                "collectives would run on a torch process group, outside this package's "
                "channel and deadline. Turn it off. Nothing was changed."
            )

    optimizations = getattr(inductor_config, "aten_distributed_optimizations", None)
    if getattr(optimizations, "spmd_check", False) and not cache_agreement:
        raise Unsupported(
            "torch._inductor.config.aten_distributed_optimizations.spmd_check is on: its check "
            "runs after AOTAutograd's cache lookup, which a rank that hit its cache never "
            "passes, so the ranks that compile would wait on the others. Pass "
            "cache_agreement=True (every rank then compiles, or none), or turn it off. "
            "Nothing was changed."
        )


def _warn_about_cache_skew(cache_agreement: bool) -> None:
    """The partitioner's sync with AOTAutograd's cache on and no cache-hit
    agreement: a rank that hits skips the sync, and the others' exchange
    fails (a Desync or Timeout naming it, not a hang)."""
    import torch._functorch.config as functorch_config

    if not getattr(functorch_config, "_sync_decision_cross_ranks", False):
        return
    if cache_agreement or getattr(functorch_config, _cache_vote.TORCH_FLAG, False):
        return
    if getattr(torch.compiler.config, "force_disable_caches", False):
        return
    if functorch_config.enable_autograd_cache or getattr(
        functorch_config, "enable_remote_autograd_cache", False
    ):
        log.warning(
            "torch._functorch.config._sync_decision_cross_ranks is on with AOTAutograd's "
            "cache and no cache-hit agreement: a rank whose cache hits skips the "
            "partitioner's exchanges, and the others then fail with a Desync or Timeout "
            "naming it. enable(cache_agreement=True) keeps the ranks together."
        )


def _warn_about_fx_cache_skew() -> None:
    """Inductor's SPMD check with Inductor's FX graph cache on: a rank whose
    FX graph cache hits skips the post-grad passes, hence the check, even
    where the AOTAutograd cache vote made it compile; the others' check then
    fails (a Timeout naming it, not a hang); measured on torch 2.15.0
    (docs/python.md, "Every agreement")."""
    from torch._inductor import config as inductor_config

    if not getattr(inductor_config.aten_distributed_optimizations, "spmd_check", False):
        return
    if getattr(torch.compiler.config, "force_disable_caches", False):
        return
    if inductor_config.fx_graph_cache or inductor_config.fx_graph_remote_cache:
        log.warning(
            "torch._inductor.config.aten_distributed_optimizations.spmd_check is on with "
            "Inductor's FX graph cache: a rank whose FX graph cache hits skips the post-grad "
            "passes and so the SPMD check (cache_agreement=True votes on AOTAutograd's cache "
            "only), and the others then fail with a Timeout naming it. Turn "
            "torch._inductor.config.fx_graph_cache off, or keep every rank's Inductor cache "
            "in the same state."
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
    if timeout is not None:
        from ._native import parse_timeout_secs

        # Core's rule, as for CCOL_TIMEOUT_S (at most ten years): a larger
        # deadline overflowed on its way to the store's and Gloo's waits.
        try:
            parse_timeout_secs(repr(value))
        except InvalidArgument as e:
            raise InvalidArgument(f"{what}: {e}") from None
    return value


#: Settings that shape automatic-dynamic, recompile and graph decisions: must
#: be equal on every rank. Each is a list of where torch versions keep it,
#: first choice first: the value is read from the first place the followed
#: version's table entry has (``compile_on_one_rank`` is in
#: ``torch.distributed.config`` up to 2.13, ``torch.compiler.config`` from
#: 2.14, where the former is a deprecated alias). Every place is a table entry.
_CONFIG = [
    ["torch._dynamo.config.automatic_dynamic_shapes"],
    ["torch._dynamo.config.automatic_dynamic_shapes_mark_as"],
    ["torch._dynamo.config.assume_static_by_default"],
    ["torch._dynamo.config.specialize_int"],
    ["torch._dynamo.config.specialize_float"],
    ["torch._dynamo.config.force_parameter_static_shapes"],
    ["torch._dynamo.config.force_nn_module_property_static_shapes"],
    ["torch._dynamo.config.allow_unspec_int_on_nn_module"],
    ["torch._dynamo.config.capture_scalar_outputs"],
    ["torch._dynamo.config.capture_dynamic_output_shape_ops"],
    ["torch._dynamo.config.recompile_limit"],
    ["torch._dynamo.config.accumulated_recompile_limit"],
    ["torch._dynamo.config.enable_compiler_collectives"],
    ["torch._dynamo.config.automatic_dynamic_exclusion_guard"],
    ["torch._dynamo.config.canonicalize_output_graph_node_order"],
    ["torch.fx.experimental._config.use_duck_shape"],
    ["torch.compiler.config.dynamic_sources"],
    ["torch.compiler.config.unbacked_sources"],
    ["torch.compiler.config.dynamic_values"],
    ["torch.compiler.config.static_sources"],
    ["torch.compiler.config.compile_on_one_rank", "torch.distributed.config.compile_on_one_rank"],
    ["torch._functorch.config._sync_decision_cross_ranks"],
    ["torch._functorch.config._sync_cache_decision_cross_ranks"],
    # The caches and agreements (2.15's config states the cache vote's
    # preconditions: every rank reaches try_load for the same compiles).
    ["torch._functorch.config.enable_autograd_cache"],
    ["torch._functorch.config.enable_remote_autograd_cache"],
    ["torch._functorch.config.bundled_autograd_cache"],
    ["torch._inductor.config.fx_graph_cache"],
    ["torch._inductor.config.fx_graph_remote_cache"],
    ["torch._inductor.config.autotune_remote_cache"],
    ["torch._inductor.config.distributed_max_autotune_gemm"],
    ["torch._inductor.config.aten_distributed_optimizations.spmd_check"],
    ["torch._inductor.config.aten_distributed_optimizations.spmd_mismatch"],
    ["torch.compiler.config.force_disable_caches"],
    ["torch.compiler.config.cache_key_tag"],
]


def _settings(version: str) -> list:
    """(path, value) of each _CONFIG setting, read where torch `version` (a
    table version: the one followed) keeps it; value None where it has none."""
    known = _compat.load_table()["versions"][version]
    out = []
    for places in _CONFIG:
        path = next((p for p in places if known.get(p)), None)
        if path is None:
            out.append((places[0], None))
            continue
        module, name = path.rsplit(".", 1)
        try:
            value = repr(getattr(_resolve(module), name))
        except (ImportError, AttributeError):
            value = "<absent>"
        out.append((path, value))
    return out


def _must_agree(guard_votes: bool, allow_untested: bool, version: str,
                cache_agreement: bool = False, check_graphs: bool = False) -> str:
    from ._native import VERSION, WIRE_VERSION

    fields = [
        f"torch={torch.__version__}",
        f"torch_followed={version}",
        f"compiler_collectives={VERSION}",
        f"wire={WIRE_VERSION}",
        f"guard_votes={guard_votes}",
        f"allow_untested_torch={allow_untested}",
        f"cache_agreement={cache_agreement}",
        f"check_graphs={check_graphs}",
    ]
    for path, value in _settings(version):
        fields.append(f"{path}={'<absent in torch ' + version + '>' if value is None else value}")
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
                ds.all_states = st.channel.exchange_local_state(
                    _frame_key(tx), ds.local_state, _joinable()
                )
            except Error as e:
                st.pending = e
                raise
        # As Dynamo does: tracing may diverge with what the exchange said.
        tx.speculation_log.clear()
        raise exc.CompileCollectiveRestartAnalysis

    run_compiler_collective.__wrapped__ = original
    return run_compiler_collective


def _joinable() -> bool:
    """Whether Dynamo's fold of every rank's state equals one fold of their
    join under this thread's settings (read where Dynamo reads them: in the
    compiling thread): automatic dynamic shapes on (off, the fold
    overwrites) and the exclusion guard off (on, the fold's
    ``excluded_sizes`` depend on the order and number of states). The rule:
    docs/python.md, "Which states Dynamo folds"."""
    config = torch._dynamo.config
    return bool(config.automatic_dynamic_shapes) and not getattr(
        config, "automatic_dynamic_exclusion_guard", False
    )


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


def _sigint_interrupts() -> bool:
    """Whether a Ctrl-C may end this thread's waits at once: only in
    Python's main thread (the one that gets ``KeyboardInterrupt``), and only
    while SIGINT has a Python handler (not ``SIG_IGN``/``SIG_DFL``)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return False
    return callable(signal.getsignal(signal.SIGINT))


def _group_ranks(group) -> list[int]:
    """The job ranks, ascending, of the ranks that compile the same program
    as this one: ``group`` as ``enable`` takes it (see there). Raises
    ``InvalidArgument`` for anything else, a rank out of the job or listed
    twice, or a group without this rank."""
    world = dist.get_world_size()
    if group is None:
        return list(range(world))
    what = repr(group)
    try:
        from torch.distributed.device_mesh import DeviceMesh
    except ImportError:  # a torch built without it
        DeviceMesh = ()
    if group is getattr(dist.GroupMember, "NON_GROUP_MEMBER", object()):
        raise InvalidArgument(
            f"rank {dist.get_rank()} is not a member of the ProcessGroup it passed to enable() "
            "(torch gives non-members GroupMember.NON_GROUP_MEMBER); every rank passes the "
            "group of ranks that compile the same program as itself"
        )
    if isinstance(group, dist.ProcessGroup):
        ranks = dist.get_process_group_ranks(group)
    elif DeviceMesh and isinstance(group, DeviceMesh):
        if group.ndim != 1:
            raise InvalidArgument(
                f"group: a DeviceMesh of {group.ndim} dimensions; pass (mesh, dim_name) "
                "for the dimension whose ranks compile the same program"
            )
        ranks = group.mesh.flatten().tolist()
    elif isinstance(group, tuple) and len(group) == 2 and DeviceMesh and isinstance(
        group[0], DeviceMesh
    ):
        mesh, dim = group
        if not isinstance(dim, str):
            raise InvalidArgument(
                f"group: (DeviceMesh, dim_name) takes the dimension by its name (a str), "
                f"not {dim!r} (the mesh's dimensions: {list(mesh.mesh_dim_names or ())})"
            )
        if dim not in (mesh.mesh_dim_names or ()):
            raise InvalidArgument(
                f"group: the DeviceMesh has no dimension {dim!r} "
                f"(its dimensions: {list(mesh.mesh_dim_names or ())})"
            )
        ranks = dist.get_process_group_ranks(mesh.get_group(dim))
    elif isinstance(group, (list, tuple, range)):
        ranks = list(group)
    else:
        raise InvalidArgument(
            "group must be None (the world), a torch ProcessGroup, a 1-D DeviceMesh, "
            f"(DeviceMesh, dim_name) or a list of job ranks, not {what}"
        )
    if not ranks or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        raise InvalidArgument(f"group: expected a non-empty list of job ranks (ints), got {what}")
    out = sorted(ranks)
    if any(a == b for a, b in zip(out, out[1:])):
        raise InvalidArgument(f"group: a rank is listed twice in {out}")
    if out[0] < 0 or out[-1] >= world:
        raise InvalidArgument(f"group: ranks {out} are not all in a job of {world} ranks")
    me = dist.get_rank()
    if me not in out:
        raise InvalidArgument(
            f"rank {me} is not in the group it passed to enable() ({out}); every rank passes "
            "the group of ranks that compile the same program as itself"
        )
    return out


def _connect(channel_type, store, timeout_s: float, pgo, local_state_type, ranks: list[int]):
    """The channel among `ranks` (job ranks, ascending), rendezvoused
    through `store` under a prefix derived from them: each group of a job
    gets its own channel, and its errors name job ranks."""
    prefix = f"ccol/torch/{_generation}"
    subgroup = len(ranks) != dist.get_world_size()
    if subgroup:
        digest = hashlib.sha256(",".join(map(str, ranks)).encode()).hexdigest()[:16]
        prefix += f"/group-{len(ranks)}-{digest}"
    return channel_type(
        store,
        ranks.index(dist.get_rank()),
        len(ranks),
        prefix=prefix,
        timeout_s=timeout_s,
        pgo=pgo,
        local_state_type=local_state_type,
        sigint=_sigint_interrupts(),
        group_ranks=ranks if subgroup else None,
        job_rank=dist.get_rank(),
        job_world_size=dist.get_world_size(),
    )


def enable(
    *,
    timeout: Union[None, float, int, datetime.timedelta] = None,
    guard_votes: bool = False,
    allow_untested_torch: bool = False,
    group=None,
    cache_agreement: bool = False,
    check_graphs: bool = False,
) -> None:
    """Puts Dynamo's compiler collectives (and, with ``guard_votes``, its
    guard collectives) on this package's channel. Call it on every rank,
    after ``torch.distributed.init_process_group`` and before the first
    compiled call; ranks of a group must pass the same ``guard_votes``.

    Args:
        timeout: the deadline of the rendezvous and of every exchange, in
            seconds or as a ``timedelta``, positive and at most ten years
            (``InvalidArgument`` otherwise); default ``CCOL_TIMEOUT_S``, else
            300 s.
        guard_votes: also take a guard vote per call of a frame with
            compiled entries (``torch.compiler.set_enable_guard_collectives``
            semantics: any rank's miss makes every rank recompile).
        allow_untested_torch: run on a torch that matches none of the tested
            versions (``TORCH_VERSIONS``): one warning (logger
            ``compiler_collectives.torch``) names what differs from the
            nearest tested version, whose behaviour is then followed. It
            still refuses when something required is missing or cannot be
            called as this module calls it. Ranks must pass the same value.
        group: the ranks that compile the same program as this one, which
            take the same compile decisions: ``None`` (the default: every
            rank of the job), a torch ``ProcessGroup`` (its members, from
            ``dist.get_process_group_ranks``), a 1-D ``DeviceMesh``,
            ``(mesh, dim_name)`` (the members of this rank's group along that
            dimension), or a list of job ranks. In a job with several such
            groups (each pipeline stage's replicas), every rank passes its
            own: each group gets its own channel, rendezvoused through the
            default group's store under a key derived from its sorted ranks,
            with no torch collective, and its errors name job ranks.
        cache_agreement: keep an AOTAutograd cache hit only if every rank
            of the group hit (on 2.15 also turned on by torch's
            ``_sync_cache_decision_cross_ranks``). Ranks must pass the same.
        check_graphs: before each graph goes to the backend, the group
            compares its fingerprint (ops, order, dtypes, shapes of
            collective inputs); ranks that traced different graphs all raise
            ``GraphMismatch``. Ranks must pass the same.

    Every other compile-time agreement of PT2 — the partitioner's decision
    sync, Inductor's distributed autotuning and its SPMD check — runs on the
    channel too while enabled, when torch's own switch for it is on
    (docs/python.md, "Every agreement").

    Turns ``torch._dynamo.config.enable_compiler_collectives`` on
    (``disable`` restores it). Costs one rendezvous through the default
    group's store, then one check that every rank has the same torch
    version, Dynamo and compiler configuration (automatic dynamic shapes,
    recompile limits, dynamic/unbacked sources, …), wire version,
    ``guard_votes`` and ``allow_untested_torch``. Reading torch's source for
    the version check takes about 2 s, once per process.

    Raises:
        IncompatibleTorch: this torch matches none of the tested versions
            (the message names the version and each entry that differs from
            the nearest tested one), and ``allow_untested_torch`` is off; or
            it is on and a required entry is missing (nothing is changed).
        Unsupported: Inductor's ``aten_distributed_optimizations.spmd_check``
            is on without ``cache_agreement``, or this torch lacks what an
            agreement asked for hooks into (nothing is changed).
        InvalidArgument: no default process group, already enabled, a bad
            timeout, or a bad ``group`` (not one of the forms above, a rank
            out of the job or listed twice, or a group without this rank).
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
    if not isinstance(allow_untested_torch, bool):
        raise InvalidArgument(
            f"allow_untested_torch must be a bool, not {allow_untested_torch!r}"
        )
    decision = _check_torch(allow_untested_torch)
    available = _available(decision.version)
    _check_agreements(cache_agreement, check_graphs, available)
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

    ranks = _group_ranks(group)
    store = dist.distributed_c10d._get_default_store()
    _generation += 1
    try:
        channel = _connect(CompileChannel, store, timeout_s, pgo, LocalState, ranks)
    except Error as e:
        _report(e)
        raise
    st = _State(channel, guard_votes, cache_agreement, check_graphs)
    st.ranks = ranks

    previous_flag = torch._dynamo.config.enable_compiler_collectives
    torch._dynamo.config.enable_compiler_collectives = True
    st.restore.append(
        lambda: setattr(torch._dynamo.config, "enable_compiler_collectives", previous_flag)
    )
    try:
        channel.agree(
            ENABLE_KEY,
            _must_agree(guard_votes, allow_untested_torch, decision.version,
                        cache_agreement, check_graphs),
        )
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
    _install_agreements(st, available)
    _warn_about_cache_skew(cache_agreement)
    _warn_about_fx_cache_skew()
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


def _install_agreements(st: _State, available: set) -> None:
    """Puts every agreement the followed torch has on the channel (each acts
    only when its switch is on: docs/python.md, "Every agreement")."""
    if "cache_vote_2_15" in available:
        _cache_vote.install(st, _patch, has_torch_sync=True)
    elif "cache_vote_before_2_15" in available:
        _cache_vote.install(st, _patch, has_torch_sync=False)
    if "partitioner" in available:
        _partitioner.install(st, _patch)
    if "autotune" in available:
        _autotune.install(st, _patch)
    if "spmd_check" in available:
        _graph_check.install_spmd_check(st, _patch)
    if st.check_graphs:
        _graph_check.install_graph_check(st, _patch, _frame_key)


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
    """The channel's rank and world size (in its group), its members' job
    ranks (``group``, ascending), deadline (seconds), store, next exchange
    number and exchange (``"flat"``, or ``"tree"`` from
    ``CCOL_HIERARCHICAL_FROM`` ranks, default 64), or None when not
    enabled."""
    st = _state
    if st is None:
        return None
    c = st.channel
    return {
        "rank": c.rank,
        "world_size": c.world_size,
        "group": list(st.ranks),
        "timeout_s": c.timeout_s,
        "store": c.store,
        "next_exchange": c.next_exchange,
        "topology": c.topology,
        "guard_votes": st.guard_votes,
        "cache_agreement": st.cache_agreement,
        "check_graphs": st.check_graphs,
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

