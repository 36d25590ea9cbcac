"""Inductor's distributed GEMM autotuning on the package's channel.

With ``torch._inductor.config.distributed_max_autotune_gemm`` on, Inductor
shares the autotuning of a graph's GEMMs among the ranks
(``torch/_inductor/distributed_autotune.py``, torch 2.13–2.15): the k-th op
that has several choices is tuned by the rank ``k % size`` (its owner),
the others put a placeholder in, and ``_sync`` all_gathers the owners'
winners (``_SerializedChoice``, pickled) on a group tagged
``pt2_distributed_autotune_pg``, which ``get_autotune_pg`` creates on first
use. Ranks whose op sequences differ fail an assertion or hang.

While the package is enabled, only ``get_autotune_pg`` and ``_sync`` are
replaced, and ``maybe_autotune_remote`` is wrapped to record each op:

- ``get_autotune_pg`` returns the package's stand-in group (the one
  ``get_compile_pg`` returns: ``rank()`` and ``size()`` of the channel's group) (no torch group is created), so ownership is
  Inductor's rule over ``enable``'s group;
- ``_sync`` sends this rank's winners as typed values (index, template uid,
  and the template's keyword arguments: ints, strings, bools) in one
  exchange under :data:`KEY`, whose configuration is the op list (index,
  kernel name and layout of every op, recorded by the wrapper): ranks whose
  op lists differ all get ``Disagreement`` naming them and their lists,
  instead of an assertion or a hang. The winners come back as Inductor's
  ``_SerializedChoice`` objects, indexed by op, each from its owner; a
  winner for an op that is not the sender's, a missing or a repeated one is
  a ``DecodeError`` naming the rank.
"""

from __future__ import annotations

import json
from typing import Any, Callable, List

from . import _policy
from ._errors import DecodeError, Error

#: The compile key of the winners' exchange.
KEY = "torch.inductor.distributed_autotune"
#: The attribute of Inductor's per-graph autotune state where the wrapper
#: records the op list: (index, kernel name, layout) per op.
OPS_ATTR = "_ccol_ops"


def op_list_text(ops: List[tuple]) -> str:
    """The canonical text of an op list (one line per op: index, kernel
    name, layout, tab-separated)."""
    return "\n".join(f"{index}\t{name}\t{layout}" for index, name, layout in ops)


def encode_choice(choice) -> str:
    """A ``_SerializedChoice`` as JSON text: its index, template uid and
    keyword arguments (ints, strings, bools: what Inductor parses them to)."""
    return json.dumps(
        {"index": choice.index, "template_uid": choice.template_uid, "kwargs": choice.kwargs},
        sort_keys=True,
    )


def decode_choice(serialized_choice_type, text: str, rank: int):
    """The ``_SerializedChoice`` of :func:`encode_choice`'s text from job
    rank ``rank``; raises ``DecodeError`` naming it for anything else."""

    def bad(why: str) -> DecodeError:
        return DecodeError(f"job rank {rank} sent an autotuning winner that {why}: {text[:200]!r}")

    try:
        value = json.loads(text)
    except ValueError as e:
        raise bad(f"is not JSON ({e})") from None
    if not isinstance(value, dict) or set(value) != {"index", "template_uid", "kwargs"}:
        raise bad("is not {index, template_uid, kwargs}")
    index, uid, kwargs = value["index"], value["template_uid"], value["kwargs"]
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise bad("has no op index")
    if not isinstance(uid, str) or not isinstance(kwargs, dict):
        raise bad("has no template uid or keyword arguments")
    if not all(isinstance(v, (int, str, bool)) for v in kwargs.values()):
        raise bad("has a keyword argument that is not an int, a string or a bool")
    choice = serialized_choice_type.__new__(serialized_choice_type)
    choice.index, choice.template_uid, choice.kwargs = index, uid, kwargs
    return choice


def install(st, patch: Callable[..., None]) -> None:
    """Replaces ``get_autotune_pg`` and ``_sync`` and wraps
    ``maybe_autotune_remote`` in ``torch._inductor.distributed_autotune``."""
    import torch._inductor.distributed_autotune as da

    group = st.group  # rank() and size() of the channel's group
    original_remote = da.__dict__["maybe_autotune_remote"]

    def get_autotune_pg():
        # A local compile tunes every op itself (torch's rule without a group).
        return group if _policy.exchanging() else None

    def maybe_autotune_remote(name, choices, inputs, layout):
        from torch._inductor.virtualized import V

        state = V.get_distributed_autotune_state(check_poisoned=False)
        if not isinstance(state, da._DistributedAutotuneState):
            # Outside a graph's autotuning (the setting off): nothing to record.
            return original_remote(name, choices, inputs, layout)
        before = state.autotuned_index
        result = original_remote(name, choices, inputs, layout)
        if state.autotuned_index == before + 1:
            ops = getattr(state, OPS_ATTR, None)
            if ops is None:
                ops = []
                setattr(state, OPS_ATTR, ops)
            ops.append((before, str(name), str(layout)))
        return result

    def _sync(autotune_results):
        from torch._inductor.virtualized import V

        ops = getattr(V.distributed_autotune_state, OPS_ATTR, [])
        if not _policy.exchanging():
            # A local compile shared no op: its own winners, by op index.
            return sorted(autotune_results, key=lambda c: c.index)
        return sync(st, da._SerializedChoice, autotune_results, ops)

    get_autotune_pg.__wrapped__ = da.__dict__["get_autotune_pg"]
    _sync.__wrapped__ = da.__dict__["_sync"]
    maybe_autotune_remote.__wrapped__ = original_remote
    patch(st, da, "get_autotune_pg", get_autotune_pg)
    patch(st, da, "_sync", _sync)
    patch(st, da, "maybe_autotune_remote", maybe_autotune_remote)


def sync(st, serialized_choice_type, autotune_results, ops: List[tuple]) -> List[Any]:
    """The replaced ``_sync``: every rank's winners, indexed by op.

    ``autotune_results`` are this rank's ``_SerializedChoice`` objects (the
    ops it owns), ``ops`` the graph's op list as recorded. Raises
    ``Disagreement`` (op lists differ), ``DecodeError`` (a winner that is
    not its sender's to give, missing or repeated) or the exchange's errors.
    """
    channel = st.channel
    try:
        lists = channel.gather_texts(
            KEY, [encode_choice(c) for c in autotune_results], config=op_list_text(ops)
        )
        count = len(ops)
        by_index: List[Any] = [None] * count
        for member, texts in enumerate(lists):
            rank = st.ranks[member]
            for text in texts:
                choice = decode_choice(serialized_choice_type, text, rank)
                if choice.index >= count or choice.index % channel.world_size != member:
                    raise DecodeError(
                        f"job rank {rank} sent the autotuning winner of op {choice.index}, "
                        f"which is not its own (op k is tuned by the group's member "
                        f"k % {channel.world_size}, among {count} ops)"
                    )
                if by_index[choice.index] is not None:
                    raise DecodeError(f"job rank {rank} sent op {choice.index}'s winner twice")
                by_index[choice.index] = choice
        missing = [i for i, c in enumerate(by_index) if c is None]
        if missing:
            owners = sorted({st.ranks[i % channel.world_size] for i in missing})
            raise DecodeError(
                f"no autotuning winner came for ops {missing[:16]} "
                f"(their owners: job ranks {owners})"
            )
    except Error as e:
        st.pending = e
        raise
    return by_index
