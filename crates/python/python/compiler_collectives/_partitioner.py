"""functorch's partitioner decision sync on the package's channel.

With ``torch._functorch.config._sync_decision_cross_ranks`` on, the
min-cut partitioner makes every rank save the same activations for the
backward: the ranks compare a hash of their joint graphs, gather each
rank's saved nodes, take the maximum over ranks of each rank's choice's
size and all keep the smallest choice (``partitioners._sync_decision_cross_ranks``,
torch 2.13–2.15). It runs only when the group has more than one rank and
the joint graph holds functional collectives. torch runs it as two
``all_gather_object`` (pickles) and one ``all_reduce`` on the default group
(2.13, 2.14) or on its ``pt2_compile_sync_pg`` Gloo group (2.15), without a
deadline of its own.

While the package is enabled, the module function is replaced: the same
three exchanges run on the channel as typed values (a digest, lists of
node names, sizes; :data:`KEYS`), among the ranks of ``enable``'s group,
with the channel's deadline. What each rank computes is torch's:
canonical node names (``_canonical_node_names``), node sizes
(``_size_of``), and the hash text of the version followed — the target as
``str(target)`` in 2.13 and ``_stable_target_str(target)`` from 2.14
(``str`` of a plain Python function holds its address, so 2.13's hashes
differ across processes for graphs with such targets, and it skips the
sync: kept). When the hashes differ the ranks keep their own decisions, as
torch does, and this is logged (logger ``compiler_collectives.torch``,
INFO, the groups of ranks by hash); with ``enable(check_graphs=True)``
the graph check has already raised before the partitioner runs.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Callable, Dict, List

from . import _policy
from ._errors import DecodeError, Error

log = logging.getLogger("compiler_collectives.torch")

#: The compile keys of the three exchanges, in order.
KEYS = (
    "torch.partitioner.joint_graph",
    "torch.partitioner.saved_names",
    "torch.partitioner.saved_sizes",
)
#: The tlparse artifact torch writes (the same name, so its tools find it).
ARTIFACT = "aot_joint_graph_sync_decision_cross_ranks"

_COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "c10d_functional"})


def has_collectives(joint_graph) -> bool:
    """Whether the joint graph calls a functional collective (torch's gate)."""
    import torch

    return any(
        isinstance(n.target, torch._ops.OpOverload) and n.target.namespace in _COLLECTIVE_NAMESPACES
        for n in joint_graph.nodes
    )


def hash_text(partitioners, joint_graph, canonical: Dict) -> str:
    """The text torch hashes (the version's own rule: see the module doc):
    every node by canonical name, ``name:op`` for placeholders and
    ``name:op:target`` otherwise, joined by ``/``."""
    target_str = getattr(partitioners, "_stable_target_str", str)

    def one(n) -> str:
        if n.op == "placeholder":
            return f"{canonical[n]}:{n.op}"
        return f"{canonical[n]}:{n.op}:{target_str(n.target)}"

    return "/".join(one(n) for n in sorted(joint_graph.nodes, key=lambda n: canonical[n]))


def groups_by_value(values: List[str], ranks: List[int]) -> List[List[int]]:
    """The job ranks holding each distinct value, in order of first rank."""
    seen: Dict[str, List[int]] = {}
    for value, rank in zip(values, ranks):
        seen.setdefault(value, []).append(rank)
    return list(seen.values())


def install(st, patch: Callable[..., None]) -> None:
    """Replaces ``partitioners._sync_decision_cross_ranks`` (called through
    the module global by the min-cut partitioner, only when torch's flag is
    on) with the exchanges on ``st.channel``."""
    import torch._functorch.partitioners as partitioners
    from torch._logging import trace_structured

    original = partitioners.__dict__["_sync_decision_cross_ranks"]

    def _sync_decision_cross_ranks(joint_graph, saved_values):
        channel = st.channel
        if channel.world_size < 2 or not _policy.exchanging() or not has_collectives(joint_graph):
            return saved_values
        canonical = partitioners._canonical_node_names(joint_graph)
        by_name = {name: node for node, name in canonical.items()}
        digest = hashlib.sha256(hash_text(partitioners, joint_graph, canonical).encode()).hexdigest()
        try:
            digests = [d[0] for d in channel.gather_texts(KEYS[0], [digest])]
            if any(d != digests[0] for d in digests):
                log.info(
                    "partitioner decision sync skipped: the joint graphs differ (ranks by "
                    "graph: %s); each rank keeps its own saved values",
                    groups_by_value(digests, st.ranks),
                )
                return saved_values
            names = channel.gather_texts(KEYS[1], [canonical[x] for x in saved_values])
            sizes = []
            mine: Dict[str, int] = {}
            for index, rank_names in enumerate(names):
                total = 0
                for name in rank_names:
                    node = by_name.get(name)
                    if node is None:
                        raise DecodeError(
                            f"job rank {st.ranks[index]} saved node {name[:200]!r} for the "
                            f"backward, which the joint graph of job rank "
                            f"{st.ranks[channel.rank]} lacks (their graph hashes are equal)"
                        )
                    size = partitioners._size_of(node)
                    total += size
                    if index == channel.rank:
                        mine[node.name] = size
                mine["total size"] = total
                sizes.append(total)
            maxed = channel.max_each(KEYS[2], sizes)
        except Error as e:
            st.pending = e
            raise
        picked = min(range(len(maxed)), key=lambda i: (maxed[i], i))
        text = f"picked_rank_idx={picked}, saved_nodes of current rank={mine}"
        trace_structured(
            "artifact",
            metadata_fn=lambda: {"name": ARTIFACT, "encoding": "string"},
            payload_fn=lambda: text,
        )
        return [by_name[n] for n in names[picked]]

    _sync_decision_cross_ranks.__wrapped__ = original
    patch(st, partitioners, "_sync_decision_cross_ranks", _sync_decision_cross_ranks)
