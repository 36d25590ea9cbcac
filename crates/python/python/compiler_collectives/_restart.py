"""Dynamo's restart after a frame exchange, skipped where it cannot change
anything (``enable(skip_restart=True)``, the default).

Dynamo traces an exchanged frame twice. The first trace (the preflight)
takes each source's own observation: ``pgo.process_automatic_dynamic``
returns it unchanged while ``DistributedState.all_states`` is None and
records it in ``local_state``, without touching the code state. After the
exchange Dynamo raises ``CompileCollectiveRestartAnalysis``; the second
trace folds, for each source it consults, every state Dynamo was handed
(``all_states``, in order) into this rank's prior code-state entry
(``update_automatic_dynamic``: the entries' ``|=``, or an overwrite when
``automatic_dynamic_shapes`` is off), and builds the graph from the folded
entries.

The restart clears the speculation log, so it replays every analysis the
preflight made (one that found a graph break, then the one that stopped
there): the sources it consults are those of ``local_state``, every
analysis's together, in the order they were first consulted.

The builder reads an entry after changing it for a dim marked dynamic
(``mark_dynamic``, ``dynamic_sources``: a ``|=`` into the entry returned),
in the preflight and again, on the folded entry, in the restart: a source
so marked always restarts (``_changed_after_recording``).

Tracing is deterministic given the entries the builder reads. So where,
for every source the preflight consulted, that fold gives back exactly the
entry the preflight used (every field, ``excluded_sizes`` and
``excluded_scalar`` included: Dynamo's ``==`` ignores them, the builder
reads them under the exclusion guard), the second trace would rebuild the
same graph with the same guards. The package then folds the code state for
real, as the second trace would (the same calls, in the order the sources
were consulted), and lets the first trace go on to compile, its
speculation log kept. Anywhere else (a source whose fold differs, or any
doubt) it restarts as Dynamo does. docs/python.md, "No second trace".

The decision is each rank's own, and needs none of the others: the
exchange ran once either way, a restarted trace exchanges nothing more
(``all_states`` is set), and each rank compiles the graph the restart
would have given it. Ranks may decide differently (their prior code
states may differ) without any effect on what runs collectively.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Optional

import torch

from . import _policy

log = logging.getLogger("compiler_collectives.torch")

#: Longest description of an entry in the restart's DEBUG line (characters).
MAX_SHOWN = 300


def code_id(tx):
    """The code state's key of ``tx``'s frame, as that version's
    ``update_automatic_dynamic`` makes it: ``CodeId.make(f_code, closure)``
    from 2.12, ``CodeId.make(f_code)`` before."""
    import torch._dynamo.pgo as pgo

    try:
        return pgo.CodeId.make(tx.f_code, getattr(tx, "closure", None))
    except TypeError:  # torch 2.11: the key has no closure
        return pgo.CodeId.make(tx.f_code)


def _fields(entry) -> tuple:
    return tuple(getattr(entry, f.name) for f in dataclasses.fields(entry))


def _show(entry) -> str:
    text = ", ".join(f"{f.name}={getattr(entry, f.name)!r}" for f in dataclasses.fields(entry))
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…"


def _changed_after_recording(entry) -> bool:
    """Whether the builder changed `entry` after the preflight recorded it:
    a tensor's entry with a dynamic dim, or excluded sizes or scalar set,
    which no fresh observation has. The builder ``|=``s a dim marked
    dynamic (``mark_dynamic``, ``dynamic_sources``) into the entry that
    ``process_automatic_dynamic`` returned, the preflight's own record or,
    in the restart, the folded code-state entry, whose result (its
    ``excluded_sizes`` among others) the fold on copies does not give."""
    from torch._dynamo.pgo import auto_dynamic

    size = entry.size
    if isinstance(size, tuple) and any(s is auto_dynamic for s in size):
        return True
    return (getattr(entry, "excluded_sizes", None) is not None
            or getattr(entry, "excluded_scalar", None) is not None)


def first_change(tx, observed: dict, all_states) -> Optional[str]:
    """The first source (in the order the preflight consulted them) whose
    entry after Dynamo's fold of ``all_states`` into a copy of this rank's
    prior code-state entry differs from ``observed[source]``, the entry the
    preflight used, in any field; described in words. None when there is
    none. Reads the code state as the restart would
    (``pgo.get_code_state()``) and changes nothing."""
    if not observed:
        return None
    import torch._dynamo.pgo as pgo

    code_state = pgo.get_code_state().get(code_id(tx))
    merge = bool(torch._dynamo.config.automatic_dynamic_shapes)
    for name, seen in observed.items():
        if _changed_after_recording(seen):
            return (f"{name}: its entry was changed after it was recorded (a dim marked "
                    f"dynamic): ({_show(seen)})")
        if code_state is not None and name in code_state.automatic_dynamic:
            folded = copy.copy(code_state.automatic_dynamic[name])
        else:
            # What the code state's defaultdict would create.
            folded = pgo.CodeState().automatic_dynamic[name]
        found = False
        for state in all_states:
            entry = state.automatic_dynamic.get(name)
            if entry is None:
                continue
            found = True
            if merge:
                folded |= entry
            else:
                folded = entry
        if not found:
            return f"{name}: in no rank's exchanged state"
        if _fields(folded) != _fields(seen):
            return f"{name}: the preflight used ({_show(seen)}), the fold gives ({_show(folded)})"
    return None


def fold(tx, observed: dict, all_states) -> None:
    """Folds ``all_states`` into the code state for each source of
    ``observed``, in its order, as the restarted trace would
    (``process_automatic_dynamic`` with ``all_states`` set)."""
    import torch._dynamo.pgo as pgo

    for name in observed:
        for state in all_states:
            entry = state.automatic_dynamic.get(name)
            if entry is not None:
                pgo.update_automatic_dynamic(tx, name, entry)


def restart_reason(st, tx, observed: dict, all_states) -> Optional[str]:
    """Why this rank must restart after the exchange, or None when the
    restart cannot change anything. Never raises: a failure to decide is a
    reason to restart."""
    if not st.skip_restart:
        return "skip_restart=False"
    if st.skip_gate is not None:
        return st.skip_gate
    try:
        return first_change(tx, observed, all_states)
    except Exception as e:  # noqa: BLE001 - in doubt, restart
        return f"cannot compare the entries ({type(e).__name__}: {e})"


def after_exchange(st, tx, observed: dict, all_states, key: str) -> bool:
    """Decides, counts and logs (one DEBUG line); on a skip folds the code
    state. True when the first trace goes on (no restart)."""
    from torch._dynamo.utils import counters

    reason = restart_reason(st, tx, observed, all_states)
    if reason is None:
        try:
            fold(tx, observed, all_states)
        except Exception as e:  # noqa: BLE001 - the restart folds it instead
            reason = f"cannot fold the code state ({type(e).__name__}: {e})"
    if reason is None:
        counters[_policy.COUNTERS]["restart_skipped"] += 1
        log.debug("compiler_collectives: %s: restart skipped (%d sources consulted, each "
                  "folds to the entry the first trace used)", key, len(observed))
        return True
    counters[_policy.COUNTERS]["restarted"] += 1
    log.debug("compiler_collectives: %s: restart: %s", key, reason)
    return False
