"""torch.compile's compiler collectives and guard votes on the compiler-collectives protocol.

Call :func:`enable` once on every rank, after ``init_process_group``::

    import compiler_collectives.torch
    compiler_collectives.torch.enable(timeout=120)

and wrap rank-local compiled work (an evaluation on rank 0) in
:func:`local`. The front door: :func:`enable`, :func:`disable`,
:func:`local`, :func:`is_enabled`, :func:`channel_info`. What each hook
does lives in its own module:

- ``_policy``: which compiles the ranks agree on (``exchange="auto"``: a
  code object's first compile, and every recompile once guard votes are
  on; ``"always"``: every compile), and :func:`local`; wraps
  ``convert_frame._compile`` and ``exceeds_recompile_limit``.
- ``_frames``: ``OutputGraph.run_compiler_collective`` becomes one exchange
  of the frame's ``LocalState`` on this package's channel (no pickling, a
  deadline, a key naming the frame, the "holds collectives" bit); Dynamo
  keeps the restart and its fold (``pgo.process_automatic_dynamic``).
  ``get_compile_pg`` returns this package's group for an exchanged compile,
  so Dynamo never creates a process group of its own.
- ``_votes``: the guard-complete hook (any rank's miss makes every rank
  recompile), on from the start with ``guard_votes=True``, from the first
  exchanged graph that holds collectives with ``"auto"``.
- ``_surface``: ``CatchErrorsWrapper.__call__`` is wrapped, so that this
  package's errors reach the caller as themselves — not as Dynamo's
  ``InternalTorchDynamoError``, never as an eager fallback
  (``suppress_errors``) and never as a process abort.
- ``_cache_vote``, ``_partitioner``, ``_autotune``, ``_graph_check``: PT2's
  other compile-time agreements, which follow the same policy
  (docs/python.md, "Every agreement").
- ``_checks``: what ``enable`` checks first (the version table,
  ``_torch_table.json``, read by ``_compat``; the settings every rank must
  share).

The channel is a Gloo process group of this package's own (Rust, CPU,
TCP), rendezvoused through the default process group's store; no collective
runs on a torch process group. Its deadline: ``timeout``, else
``CCOL_TIMEOUT_S``, else 300 s. Under torchrun, an error that reaches the
caller is also written to ``TORCHELASTIC_ERROR_FILE``.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import hashlib
import logging
import os
import sys
from typing import Iterator, Optional, Union

import torch
import torch.distributed as dist

from . import (
    _autotune,
    _cache_vote,
    _checks,
    _compile_once,
    _compat,
    _frames,
    _graph_check,
    _lazy,
    _notice,
    _partitioner,
    _policy,
    _state,
    _surface,
    _votes,
)
from ._errors import ChannelUnusable, Error, InvalidArgument
from ._state import patch as _patch

__all__ = [
    "enable", "disable", "local", "is_enabled", "channel_info", "TORCH_VERSION", "TORCH_VERSIONS",
]

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

#: The compile key of a guard vote (fixed: every rank's k-th vote is the same
#: decision point).
GUARD_VOTE_KEY = _votes.GUARD_VOTE_KEY
#: The compile key of the check ``enable`` runs.
ENABLE_KEY = "torch.enable"
#: ``enable``'s ``exchange`` values.
EXCHANGE_MODES = ("auto", "always")

_generation = 0
_hooks_registered = False


def _sigint_interrupts() -> bool:
    """Whether a Ctrl-C may end this thread's waits at once: only in
    Python's main thread (the one that gets ``KeyboardInterrupt``), and only
    while SIGINT has a Python handler (not ``SIG_IGN``/``SIG_DFL``)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return False
    return callable(signal.getsignal(signal.SIGINT))


def _prefix(ranks: list[int]) -> str:
    """The store prefix of this ``enable``'s channel among `ranks` (job
    ranks, ascending): one per generation, and per group where the group is
    not the whole job."""
    prefix = f"ccol/torch/{_generation}"
    if len(ranks) != dist.get_world_size():
        digest = hashlib.sha256(",".join(map(str, ranks)).encode()).hexdigest()[:16]
        prefix += f"/group-{len(ranks)}-{digest}"
    return prefix


def _connect(channel_type, store, timeout_s: float, pgo, local_state_type, ranks: list[int]):
    """The channel among `ranks` (job ranks, ascending), rendezvoused
    through `store` under a prefix derived from them: each group of a job
    gets its own channel, and its errors name job ranks."""
    subgroup = len(ranks) != dist.get_world_size()
    return channel_type(
        store,
        ranks.index(dist.get_rank()),
        len(ranks),
        prefix=_prefix(ranks),
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
    exchange: str = "auto",
    guard_votes: Union[bool, str] = "auto",
    allow_untested_torch: bool = False,
    group=None,
    cache_agreement: bool = False,
    check_graphs: bool = False,
    skip_restart: bool = True,
    compile_once: bool = False,
    max_artifact_bytes: int = _compile_once.DEFAULT_MAX_ARTIFACT_BYTES,
    compile_timeout: Union[None, float, int, datetime.timedelta] = None,
    shard_kernels: bool = False,
) -> None:
    """Puts Dynamo's compiler collectives (and its guard collectives) on
    this package's channel, under an agreement policy that never stops a
    job that runs without the package (docs/python.md, "The agreement
    policy"). Call it on every rank, after
    ``torch.distributed.init_process_group`` and before the first compiled
    call; the ranks of a group must pass the same ``exchange``,
    ``guard_votes``, ``cache_agreement``, ``check_graphs``,
    ``allow_untested_torch``, ``compile_once``, ``max_artifact_bytes`` and
    ``shard_kernels`` (``skip_restart`` and ``compile_timeout`` may differ).

    Args:
        timeout: the deadline of the rendezvous and of every exchange, in
            seconds or as a ``timedelta``, positive and at most ten years
            (``InvalidArgument`` otherwise); default ``CCOL_TIMEOUT_S``, else
            300 s.
        exchange: which compiles the ranks agree on. ``"auto"`` (the
            default): a code object's first compile, reached from code every
            rank runs, and, once guard votes are on, every recompile (all
            ranks recompile together); any other recompile stays on its rank,
            as with PyTorch alone (a last batch shorter on one rank,
            ``eval()`` on rank 0), logged at INFO and counted
            (``counters["compiler_collectives"]["local_compile"]``).
            ``"always"``: every compile, as PyTorch's own compiler
            collective (a rank that recompiles alone then gets a
            ``Timeout``).
        guard_votes: ``"auto"`` (the default): every compiled call votes on
            its guards (any rank's miss makes every rank recompile) from the
            first exchanged compile whose graph holds collectives on some
            rank (c10d or functional collectives, symmetric memory, DTensor):
            the job needs the same graphs on every rank from then on.
            ``True``: from the start (``torch.compiler.set_enable_guard_collectives``
            semantics). ``False``: never.
        allow_untested_torch: run on a torch that matches none of the tested
            versions (``TORCH_VERSIONS``): one warning (logger
            ``compiler_collectives.torch``) names what differs from the
            nearest tested version, whose behaviour is then followed. It
            still refuses when something required is missing or cannot be
            called as this module calls it.
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
            ``_sync_cache_decision_cross_ranks``).
        check_graphs: before each exchanged graph goes to the backend, the
            group compares its fingerprint (ops, order, dtypes, shapes of
            collective inputs); ranks that traced different graphs all raise
            ``GraphMismatch``.
        skip_restart: after a frame exchange, go on with the first trace
            where Dynamo's restart cannot change anything: every source the
            trace consulted folds, with every rank's state, to the entry it
            used (docs/python.md, "No second trace"). Counted in
            ``counters["compiler_collectives"]["restart_skipped"]`` and
            ``["restarted"]``, with one DEBUG line per exchanged compile.
            ``False`` restarts every time, as PyTorch does (for bisecting).
            Each rank decides alone: ranks may pass different values.
        compile_once: each distinct graph is compiled by one rank of the
            group and loaded by the others: at each AOTAutograd cache lookup
            of an exchanged compile the ranks exchange their key and whether
            they loaded it; a rank that loaded it sends the entries (and
            the kernels' shared objects) to the ranks whose cache directory
            lacks them, and where none did, one owner per key (each lookup's
            next rank in turn) compiles while the others wait
            (docs/python.md, "Compile once"). Turns
            ``torch._functorch.config.force_non_lazy_backward_lowering`` on
            until ``disable``. Ranks load pickled entries and shared objects
            that a peer compiled: the job's ranks trust each other. Decides
            instead of ``cache_agreement`` where both are on.
        max_artifact_bytes: the most bytes of files one key ships to a
            rank with ``compile_once`` (default 1 GiB); past it, the ranks
            that would receive them compile themselves, with a WARNING.
        compile_timeout: with ``compile_once``, the longest a rank waits
            for another rank's compile of one graph, in seconds (``Timeout``
            naming that rank past it); None (the default): no bound but the
            owner's beats (a rank fails when the owner is lost, or sends
            nothing for ``timeout``). With ``shard_kernels``, it bounds each
            exchange of a sharded compile (default: one hour).
        shard_kernels: with ``compile_once``, a graph that every rank of the
            group computed alike and none loaded is lowered on every rank,
            and each of its C++ kernels is built by one rank and sent to
            the cache directories that lack it (docs/python.md, "Sharded
            compilation"). Needs Inductor's ``compile_threads`` of at least
            2, the same on every rank.

    Every other compile-time agreement of PT2 — the partitioner's decision
    sync, Inductor's distributed autotuning and its SPMD check — runs on the
    channel too while enabled, in exchanged compiles, when torch's own
    switch for it is on (docs/python.md, "Every agreement").

    Turns ``torch._dynamo.config.enable_compiler_collectives`` on
    (``disable`` restores it). Costs one rendezvous through the default
    group's store, then one check that every rank has the same torch
    version, Dynamo and compiler configuration (automatic dynamic shapes,
    recompile limits, dynamic/unbacked sources, …), wire version and the
    arguments above. Reading torch's source for the version check takes
    about 2 s, once per process.

    Raises:
        IncompatibleTorch: this torch matches none of the tested versions
            (the message names the version and each entry that differs from
            the nearest tested one), and ``allow_untested_torch`` is off; or
            it is on and a required entry is missing (nothing is changed).
        Unsupported: Inductor's ``aten_distributed_optimizations.spmd_check``
            is on without ``cache_agreement`` or ``compile_once``; this torch
            lacks what an agreement asked for hooks into; ``compile_once``
            with a pass that bakes the rank into a graph after its key;
            ``shard_kernels`` with ``compile_threads`` below 2 (nothing is
            changed).
        InvalidArgument: no default process group, already enabled, a bad
            timeout, ``exchange``, ``guard_votes``, ``skip_restart``,
            ``compile_once``, ``max_artifact_bytes``, ``compile_timeout`` or
            ``shard_kernels`` (on without ``compile_once``), or a
            bad ``group`` (not one of the forms above, a rank out of the job
            or listed twice, or a group without this rank).
        Timeout: a rank did not come to the rendezvous within the deadline
            (the message names it).
        Disagreement: ranks differ in what must be equal (names the ranks
            and values).
    """
    global _generation, _hooks_registered
    if _state.current is not None:
        raise InvalidArgument(
            "compiler_collectives.torch is already enabled; call disable() first"
        )
    if not isinstance(allow_untested_torch, bool):
        raise InvalidArgument(
            f"allow_untested_torch must be a bool, not {allow_untested_torch!r}"
        )
    if not isinstance(exchange, str) or exchange not in EXCHANGE_MODES:
        raise InvalidArgument(f"exchange must be 'auto' or 'always', not {exchange!r}")
    if not (isinstance(guard_votes, bool) or guard_votes == "auto"):
        raise InvalidArgument(f"guard_votes must be True, False or 'auto', not {guard_votes!r}")
    if not isinstance(skip_restart, bool):
        raise InvalidArgument(f"skip_restart must be a bool, not {skip_restart!r}")
    decision = _checks.check_torch(allow_untested_torch)
    available = _checks.available(decision.version)
    _checks.check_agreements(cache_agreement, check_graphs, available, compile_once is True)
    _checks.check_compile_once(compile_once, max_artifact_bytes, available, decision.version)
    compile_threads = _checks.check_shard_kernels(shard_kernels, compile_once, available,
                                                  decision.version)
    if compile_timeout is not None:
        compile_timeout = _checks.compile_timeout_seconds(compile_timeout)
    timeout_s = _checks.timeout_seconds(timeout)
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
    from torch._dynamo.symbolic_convert import LocalState

    from ._native import CompileChannel

    ranks = _checks.group_ranks(group)
    store = dist.distributed_c10d._get_default_store()
    _generation += 1
    try:
        channel = _connect(CompileChannel, store, timeout_s, pgo, LocalState, ranks)
    except Error as e:
        _surface.report(e)
        raise
    st = _state.State(channel, guard_votes, cache_agreement, check_graphs, exchange)
    st.ranks = ranks
    st.store = store
    st.store_prefix = f"{_prefix(ranks)}/{_notice.attempt()}"
    st.skip_restart = skip_restart
    st.skip_gate = decision.restart_gate
    st.compile_once = compile_once
    st.max_artifact_bytes = max_artifact_bytes
    st.compile_timeout = compile_timeout
    st.shard_kernels = shard_kernels
    if skip_restart and st.skip_gate is not None:
        log.info("compiler_collectives: Dynamo's restart after each frame exchange always runs "
                 "on torch %s: %s", torch.__version__, st.skip_gate)
    st.policy = _policy.Tracking()
    st.switches = _checks.switches()

    previous_flag = torch._dynamo.config.enable_compiler_collectives
    torch._dynamo.config.enable_compiler_collectives = True
    st.restore.append(
        lambda: setattr(torch._dynamo.config, "enable_compiler_collectives", previous_flag)
    )
    try:
        channel.agree(
            ENABLE_KEY,
            _checks.must_agree(guard_votes, allow_untested_torch, decision.version,
                               cache_agreement, check_graphs, exchange, compile_once,
                               max_artifact_bytes, shard_kernels, compile_threads),
        )
    except BaseException as e:
        for undo in reversed(st.restore):
            undo()
        channel.abort()
        if isinstance(e, Error):
            _surface.report(e)
        raise
    og = output_graph.OutputGraph
    _patch(st, og, "run_compiler_collective",
           _frames.make_run_compiler_collective(og.__dict__["run_compiler_collective"]))
    _patch(st, dynamo_distributed, "get_compile_pg", _frames.get_compile_pg)
    _patch(st, convert_frame, "get_compile_pg", _frames.get_compile_pg)
    _patch(st, convert_frame, "_compile", _policy.make_compile(convert_frame._compile))
    if callable(getattr(torch._dynamo, "reset", None)):
        _patch(st, torch._dynamo, "reset", _policy.make_reset(torch._dynamo.reset))
    _patch(st, convert_frame, "exceeds_recompile_limit",
           _policy.make_exceeds_recompile_limit(convert_frame.exceeds_recompile_limit))
    cew = convert_frame.CatchErrorsWrapper
    _patch(st, cew, "__call__", _surface.make_catch_errors_call(cew.__dict__["__call__"]))
    _patch(st, eval_frame, "guard_collectives_hook", _votes.torch_guard_vote)
    _install_agreements(st, available)
    try:
        st.notices = _notice.Notices(store, dist.get_rank(), _generation, timeout_s)
    except Exception as e:  # noqa: BLE001 - the job runs on without it
        log.warning("compiler_collectives: cannot watch for other ranks' failures (%s): they "
                    "will not be reported on this rank", e)
    # compile_once keeps every rank in step at each lookup: no skew to warn of.
    if not compile_once:
        _checks.warn_about_cache_skew(cache_agreement)
        _checks.warn_about_fx_cache_skew()
    if guard_votes is True:
        _votes.turn_on(st)
    previous_excepthook = sys.excepthook

    def excepthook(kind, value, tb):
        st.crashed = True
        if st.notices is not None and st.pid == os.getpid():
            st.notices.post(_notice.crash_line(dist.get_rank() if dist.is_initialized() else -1,
                                               kind, value, _next_exchange(st)))
        previous_excepthook(kind, value, tb)

    sys.excepthook = excepthook
    st.restore.append(lambda: setattr(sys, "excepthook", previous_excepthook))
    _state.current = st
    if not _hooks_registered:
        atexit.register(_at_exit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_forget_in_child)
        _hooks_registered = True


@contextlib.contextmanager
def local() -> Iterator[None]:
    """Rank-local compiled work on purpose: inside ``with local():`` every
    agreement stands aside for this thread's compiled calls — a code
    object's first compile, recompiles, guard votes, graphs that hold
    collectives, and the agreements inside a compile (the cache vote, the
    partitioner's sync, the graph checks, autotuning), for the backward
    too when it runs in this thread inside the block. What is compiled
    here takes this rank's own decisions, and may differ from the other
    ranks' compile of the same code.

    Dynamo's code state (``pgo._CODE_STATE``, what automatic dynamic
    remembers of each code object) is copied on entry and put back on exit,
    so this rank's later exchanges fold the same state as its peers'.

    A code object first compiled inside ``local()`` must stay inside it:
    the other ranks would exchange its first compile, which this rank,
    hitting its entry, never joins. The context nests; entering and leaving
    it is logged at DEBUG. Outside :func:`enable` it changes nothing.

    Example::

        if rank == 0:
            with compiler_collectives.torch.local():
                evaluate(compiled_model)
    """
    with _policy.local():
        yield


def _install_agreements(st: _state.State, available: set) -> None:
    """Puts every agreement the followed torch has on the channel (each acts
    only when its switch is on, in exchanged compiles: docs/python.md,
    "Every agreement")."""
    if "cache_vote_2_15" in available:
        _cache_vote.install(st, _patch, has_torch_sync=True)
    elif "cache_vote_before_2_15" in available:
        _cache_vote.install(st, _patch, has_torch_sync=False)
    if "partitioner" in available:
        _install_when_imported(st, "partitioner", _partitioner.install)
    if "autotune" in available:
        _install_when_imported(st, "autotune", _autotune.install)
    if "spmd_check" in available:
        _graph_check.install_spmd_check(st, _patch)
    if st.check_graphs:
        _graph_check.install_graph_check(st, _patch, _frames.frame_key)
    if st.compile_once:
        _compile_once.install(st, _patch)


def _install_when_imported(st: _state.State, agreement: str, install) -> None:
    """Installs `agreement` (its module is one of
    ``_checks.DEFERRED_MODULES``) when torch imports its module, after the
    live checks of its entries; at once where it is imported already."""
    paths = _checks.AGREEMENT_ENTRIES[agreement]
    module = next(m for m in _checks.DEFERRED_MODULES if paths[0].startswith(m + "."))

    def on_import(_module) -> None:
        if st.disabled:
            return
        _checks.check_live(paths)
        install(st, _patch)
        log.debug("compiler_collectives: %s agreement installed (%s imported)", agreement, module)

    st.restore.append(_lazy.when_imported(module, on_import))


def disable() -> None:
    """Restores everything ``enable`` replaced and shuts the channel down
    (ranks still waiting on this one get ``PeerLost`` naming it). Does
    nothing when not enabled."""
    st = _state.current
    if st is None:
        return
    _state.current = None
    st.disabled = True
    for undo in reversed(st.restore):
        undo()
    if st.notices is not None:
        st.notices.stop()
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
    return _state.current is not None


def channel_info() -> Optional[dict]:
    """The channel's rank and world size (in its group), its members' job
    ranks (``group``, ascending), deadline (seconds), store, next exchange
    number and exchange (``"flat"``, or ``"tree"`` from
    ``CCOL_HIERARCHICAL_FROM`` ranks, default 64), the policy (``exchange``,
    ``guard_votes``, ``votes_on``: whether every compiled call votes now;
    ``skip_restart``: whether Dynamo's restart after a frame exchange is
    skipped where it cannot change anything, on this torch) and the
    agreements' switches, or None when not enabled."""
    st = _state.current
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
        "exchange": st.exchange,
        "guard_votes": st.guard_votes,
        "votes_on": st.votes_on,
        "cache_agreement": st.cache_agreement,
        "check_graphs": st.check_graphs,
        "skip_restart": st.skip_restart and st.skip_gate is None,
        "compile_once": st.compile_once,
        "max_artifact_bytes": st.max_artifact_bytes,
        "compile_timeout": st.compile_timeout,
        "shard_kernels": st.shard_kernels,
    }


def _next_exchange(st: _state.State) -> Optional[int]:
    try:
        return st.channel.next_exchange
    except Exception:  # noqa: BLE001 - a closed channel
        return None


def _at_exit() -> None:
    # Tell the other ranks this one has no more exchanges, so that a rank
    # still waiting gets PeerLost naming it, not a timeout; after an uncaught
    # exception, abort instead (they see this rank lost, not finished).
    st = _state.current
    try:
        if st is not None and st.crashed and st.pid == os.getpid():
            st.channel.abort()
        disable()
    except Exception as e:  # noqa: BLE001 - exiting anyway
        log.debug("compiler_collectives: shutdown at exit: %s", e)


def _forget_in_child() -> None:
    # A process forked from a rank is not a rank: its copy of the channel
    # (whose Gloo threads did not survive the fork) is never used or closed.
    st = _state.current
    if st is not None:
        _state.current = None
        st.channel.forget_after_fork()
