"""Guard votes: the guard-complete hook on the channel
(``torch.compiler.set_enable_guard_collectives`` semantics: any rank's miss
makes every rank recompile), and when they turn on (``enable``'s
``guard_votes``: ``True`` from the start, ``"auto"`` from the first
exchanged compile whose graph holds collectives on some rank, ``False``
never)."""

from __future__ import annotations

import logging

from . import _policy, _state

log = logging.getLogger("compiler_collectives.torch")

#: The compile key of a guard vote (fixed: every rank's k-th vote is the same
#: decision point).
GUARD_VOTE_KEY = "torch.guard_vote"


def guard_vote(guard_eval_result: bool) -> bool:
    """The guard-complete hook: True when every rank's guards hit. Never
    raises (an exception here aborts the process): a failure votes "miss",
    and the recompile that follows raises it. Inside ``local()``, or before
    votes are on, this rank's own result."""
    st = _state.current
    if st is None or not st.votes_on:
        return guard_eval_result
    return _vote(st, guard_eval_result)


def torch_guard_vote(guard_eval_result: bool) -> bool:
    """What ``torch.compiler.set_enable_guard_collectives(True)`` installs
    while enabled (it replaces ``eval_frame.guard_collectives_hook``): a
    vote at every call, as torch's own, on the channel."""
    st = _state.current
    if st is None:
        return guard_eval_result
    return _vote(st, guard_eval_result)


def _vote(st, guard_eval_result: bool) -> bool:
    if _policy.in_local():
        return guard_eval_result
    if st.pending is not None:
        _policy.vote_result(False)
        return False
    try:
        hit = st.channel.vote_all_hit(GUARD_VOTE_KEY, bool(guard_eval_result))
    except BaseException as e:  # noqa: BLE001 - raised on the recompile path
        st.pending = e
        hit = False
    _policy.vote_result(hit)
    return hit


def turn_on(st) -> None:
    """Makes every compiled call vote from now on (installs the hook)."""
    from torch._C._dynamo.eval_frame import set_guard_complete_hook

    if st.votes_on and st.hook_installed:
        return
    st.votes_on = True
    previous = set_guard_complete_hook(guard_vote)
    st.hook_installed = True
    st.restore.append(lambda: set_guard_complete_hook(previous))


def graph_holds_collectives(st, key: str) -> None:
    """An exchanged compile's agreed bit was set (every rank calls this at
    the same exchange): with ``guard_votes="auto"``, votes turn on."""
    if st.guard_votes == "auto" and not st.votes_on:
        log.info(
            "compiler_collectives: guard votes on from now (every compiled call votes): "
            "the graph of %s holds collectives on some rank", key
        )
        turn_on(st)
