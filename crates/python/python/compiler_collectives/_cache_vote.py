"""AOTAutograd's cache-hit agreement on the package's channel.

A rank keeps an AOTAutogradCache hit only if every rank of its group hit:
the ranks that compile reach compile-time exchanges (the partitioner's
decision sync, Inductor's reorder passes) that ranks which loaded their
graph never reach, so a lone hit desyncs the group. Where it hooks in, per
torch version (docs/python.md, "Every agreement"):

- torch 2.15 has the agreement (``autograd_cache.sync_cache_decision_cross_ranks``,
  an all_reduce on a Gloo group tagged ``pt2_compile_sync_pg``, called by
  ``AOTAutogradCache.try_load`` before the load, by hitting, missing and
  bypassing ranks alike, and once more after a unanimous hit's load): the
  module global is replaced, so the same two calls vote on the channel and
  no torch group is created.
- torch 2.13 and 2.14 have none: ``AOTAutogradCache._lookup`` is wrapped to
  vote when ``try_load`` called it (``standalone_compile`` calls it too, and
  does not vote), after the lookup and before the load, as 2.15 does; a
  rank whose key computation raised (a bypass) never looks up and votes
  "miss" when ``try_load`` returns; a unanimous hit votes again after the
  load (the backstop). The vote inside ``_lookup`` runs inside
  ``try_load``'s ``try … except Exception`` (a failure there is a cache
  bypass), so its error is kept and raised by the ``try_load`` wrapper: a
  ``Timeout`` or ``PeerLost`` never becomes a silent recompile.

Each vote is one all_gather of every rank's hit or miss under
:data:`VOTE_KEY` (the same key before and after the load: the backstop runs only after a unanimous hit, so every rank
takes it or none does).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Optional

from . import _policy
from ._errors import Error

log = logging.getLogger("compiler_collectives.torch")

#: The compile key of a cache-hit vote.
VOTE_KEY = "torch.aot_autograd_cache_hit"

#: Where torch 2.15 keeps the agreement (a table entry; absent before 2.15).
SYNC_PATH = "torch._functorch._aot_autograd.autograd_cache.sync_cache_decision_cross_ranks"
#: torch's own switch for it (2.15), served by the channel while enabled.
TORCH_FLAG = "_sync_cache_decision_cross_ranks"


def _wanted(st) -> bool:
    """Whether this process votes: ``enable(cache_agreement=True)``, or
    torch's own flag (2.15) on while the package is enabled; never in a
    group of one, never in a local compile (``_policy``), never under
    ``compile_once`` (which decides instead: ``_compile_once``)."""
    if st.channel.world_size < 2 or not _policy.exchanging() or st.compile_once:
        return False
    if st.cache_agreement:
        return True
    import torch._functorch.config as functorch_config

    return bool(getattr(functorch_config, TORCH_FLAG, False))


#: Dynamo's counters (``torch._dynamo.utils.counters``) under this name
#: count the hits the vote dropped (``autograd_cache_hit_dropped``).
COUNTERS = "compiler_collectives"


def _vote(st, hit: bool) -> bool:
    """Whether every rank of the group hit (one all_gather of each rank's
    hit or miss); raises the exchange's error (kept in ``st.pending`` too,
    for Dynamo's error path). A hit dropped because other ranks missed is
    counted and logged (INFO) naming them."""
    try:
        votes = st.channel.gather_texts(VOTE_KEY, ["hit" if hit else "miss"])
    except Error as e:
        st.pending = e
        raise
    missed = [st.ranks[i] for i, v in enumerate(votes) if v != ["hit"]]
    if hit and missed:
        from torch._dynamo.utils import counters

        counters[COUNTERS]["autograd_cache_hit_dropped"] += 1
        log.info("AOTAutograd cache hit dropped: job ranks %s missed", missed)
    return not missed


def install(st, patch: Callable[..., None], has_torch_sync: bool) -> None:
    """Puts the agreement on ``st.channel``: replaces torch 2.15's
    ``sync_cache_decision_cross_ranks`` when ``has_torch_sync`` (the
    followed table version has it), else wraps ``AOTAutogradCache.try_load``
    and ``_lookup``. ``patch(st, owner, name, value)`` records the undo."""
    import torch._functorch._aot_autograd.autograd_cache as autograd_cache

    if has_torch_sync:
        original = autograd_cache.__dict__["sync_cache_decision_cross_ranks"]

        def sync_cache_decision_cross_ranks(local_hit: bool) -> bool:
            # torch's version also builds its compile-sync group here when
            # only the partitioner's sync is on; the package serves that
            # sync on its channel (_partitioner.py), so no group is built.
            if not _wanted(st):
                return local_hit
            return _vote(st, local_hit)

        sync_cache_decision_cross_ranks.__wrapped__ = original
        patch(st, autograd_cache, "sync_cache_decision_cross_ranks", sync_cache_decision_cross_ranks)
        return

    cache = autograd_cache.AOTAutogradCache
    original_try_load = cache.__dict__["try_load"].__func__
    original_lookup = cache.__dict__["_lookup"].__func__
    local = threading.local()

    class _Vote:
        """One ``try_load``'s votes: ``first`` is the outcome of the vote
        before the load (None until taken), ``error`` what it raised."""

        def __init__(self) -> None:
            self.first: Optional[bool] = None
            self.error: Optional[BaseException] = None

    def _lookup(*args: Any, **kwargs: Any):
        result = original_lookup(*args, **kwargs)
        vote = getattr(local, "vote", None)
        if vote is None or vote.first is not None:
            return result  # not from try_load (standalone_compile), or voted already
        try:
            vote.first = _vote(st, result is not None)
        except Exception as e:  # noqa: BLE001 - raised by the try_load wrapper
            vote.first = False
            vote.error = e
            return None
        return result if vote.first else None

    def try_load(*args: Any, **kwargs: Any):
        if not _wanted(st):
            return original_try_load(*args, **kwargs)
        vote, outer = _Vote(), getattr(local, "vote", None)
        local.vote = vote
        try:
            compiled_fn, aot_config = original_try_load(*args, **kwargs)
        except BaseException:
            local.vote = outer
            # torch re-raised (strict caching modes): vote as if it missed,
            # so that the peers do not wait for this rank.
            if vote.error is None and vote.first is not False:
                _vote(st, False)
            raise
        local.vote = outer
        if vote.error is not None:
            raise vote.error.with_traceback(vote.error.__traceback__)
        if vote.first is None:
            # The key computation raised (a bypass): no lookup, a miss.
            _vote(st, False)
        elif vote.first:
            # The backstop: a rank's load may still have failed (its
            # FXGraphCache missed). The dropped hit is not saved again.
            if not _vote(st, compiled_fn is not None):
                if compiled_fn is not None:
                    log.info("AOTAutograd cache hit dropped: another rank's load missed")
                compiled_fn = None
        return compiled_fn, aot_config

    try_load.__wrapped__ = original_try_load
    _lookup.__wrapped__ = original_lookup
    patch(st, cache, "try_load", staticmethod(try_load))
    patch(st, cache, "_lookup", staticmethod(_lookup))
