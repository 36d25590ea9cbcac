"""The graph checks: every rank of a group traced the same graph.

``enable(check_graphs=True)`` (``OutputGraph.call_user_compiler`` wrapped,
torch 2.13–2.15): before Dynamo hands a graph to the backend — where every
rank arrives, whatever its caches hold — the ranks of the group compare a
rank-independent fingerprint of it (:func:`fingerprint`): its ops in order,
their dtypes, and the shapes of the tensors that collectives take. Other
shapes are left out: uneven FSDP2 shards give ranks different static
parameter shapes in a correct job. Ranks that traced different graphs all
raise :class:`~compiler_collectives.GraphMismatch`, naming the groups of
ranks by fingerprint and the first op where they differ, before that
graph's first collective can mismatch.

Inductor's SPMD check (``config.aten_distributed_optimizations.spmd_check``,
off by default) is another check: it hashes the post-grad graph with full
shapes and strides (``spmd_check._compute_hash``) to protect its collective
reordering passes, and all_gathers the hashes (pickled) on the default
group. A rank whose AOTAutograd cache hits never reaches post-grad, so torch
hangs there under cache skew. While the package is enabled,
``spmd_check.spmd_check`` is replaced: the same hashes (and, on a
mismatch, the same diagnostic fingerprints) go over the channel, and torch's
report and its ``spmd_mismatch`` mode are kept ("warn": log and go on;
"error": every rank raises ``GraphMismatch`` with the report). ``enable``
refuses it without ``cache_agreement=True``, which makes every rank reach
post-grad or none.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Callable, List, Optional

from . import _policy
from ._errors import Error, GraphMismatch
from ._partitioner import groups_by_value

log = logging.getLogger("compiler_collectives.torch")

#: The compile key prefix of a graph check (the frame's key follows).
KEY = "torch.graph_check"
#: The compile key of the SPMD check's hashes, and of its fingerprints.
SPMD_KEYS = ("torch.inductor.spmd_check", "torch.inductor.spmd_check.fingerprints")
#: At most this many ops of each differing graph are named in an error.
_SHOWN = 3


def _is_collective(target_name: str) -> bool:
    return "c10d_functional" in target_name or target_name.startswith("torch.distributed.")


def _target_name(node) -> str:
    from torch.fx.node import _get_qualified_name

    target = node.target
    if node.op == "call_function" and callable(target):
        try:
            return _get_qualified_name(target)
        except Exception:  # noqa: BLE001 - torch's own fallback for such targets
            return getattr(target, "__name__", type(target).__name__)
    if node.op == "placeholder":
        return ""
    return str(target)


def _tensors(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def fingerprint(gm) -> List[str]:
    """One line per node of the Dynamo graph ``gm`` that makes tensors (and
    the output, and every collective): its op, target (FX's qualified
    name), the dtypes of its values, and for a collective (a
    ``c10d_functional`` op or a ``torch.distributed`` function) the shapes
    of its tensor inputs. Placeholders, whose names are rank-local, give
    their op and dtypes only. Nodes of sizes only (SymInt inputs, arithmetic
    on sizes) are left out: uneven shards give ranks different ones — a dim
    of size 1 is specialized where another rank's gets a symbol."""
    lines = []
    for node in gm.graph.nodes:
        name = _target_name(node)
        value = node.meta.get("example_value", node.meta.get("val"))
        tensors = _tensors(value)
        if not tensors and node.op != "output" and not _is_collective(name):
            # A size (a SymInt input, or arithmetic on sizes): which ones a
            # graph has depends on each rank's shapes (a dim of size 1 is
            # specialized, another gets a symbol), not on its program.
            continue
        dtypes = ",".join(str(t.dtype).removeprefix("torch.") for t in tensors)
        line = f"{node.op} {name} [{dtypes}]"
        if _is_collective(name):
            shapes = []
            for arg in node.all_input_nodes:
                inp = arg.meta.get("example_value", arg.meta.get("val"))
                shapes.extend(str(tuple(t.shape)) for t in _tensors(inp))
            line += f" inputs {' '.join(shapes)}"
        lines.append(line)
    return lines


def mismatch_message(what: str, lists: List[List[str]], ranks: List[int]) -> str:
    """The error of graphs that differ: the groups of job ranks by graph and,
    for each, its op at the first index where some group's differs (the
    same text on every rank, from every rank's lines)."""
    digests = [hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12] for lines in lists]
    groups = groups_by_value(digests, ranks)
    first = {}
    for digest, lines in zip(digests, lists):
        first.setdefault(digest, lines)
    graphs = list(first.values())
    index = 0
    while all(index < len(g) for g in graphs) and len({g[index] for g in graphs}) == 1:
        index += 1
    parts = []
    for group, lines in zip(groups, graphs):
        shown = lines[index:index + _SHOWN]
        op = "; ".join(shown) if shown else "<the graph ends here>"
        parts.append(f"job ranks {group} ({len(lines)} ops): {op}")
    return (
        f"the ranks traced different graphs for {what}: {len(groups)} graphs; "
        f"first difference at op {index}:\n  " + "\n  ".join(parts)
    )


def _groups_of(lists: List[List[str]], ranks: List[int]) -> List[List[int]]:
    return groups_by_value(["\n".join(lines) for lines in lists], ranks)


def check_graph(st, key: str, lines: List[str]) -> None:
    """Compares ``lines`` (a :func:`fingerprint`) across the group under
    ``key``; raises ``GraphMismatch`` on every rank when they differ."""
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    channel = st.channel
    exchange = channel.next_exchange
    digests = [d[0] for d in channel.gather_texts(key, [digest])]
    if all(d == digests[0] for d in digests):
        return
    lists = channel.gather_texts(key + " (ops)", lines)
    raise GraphMismatch(
        mismatch_message(key, lists, st.ranks), groups=_groups_of(lists, st.ranks),
        key=key, exchange=exchange, last_completed=channel.next_exchange - 1,
    )


def install_graph_check(st, patch: Callable[..., None], frame_key: Callable) -> None:
    """Wraps ``OutputGraph.call_user_compiler`` to check each graph first."""
    import torch._dynamo.output_graph as output_graph

    og = output_graph.OutputGraph
    original = og.__dict__["call_user_compiler"]

    def call_user_compiler(self, gm, example_inputs):
        if st.channel.world_size > 1 and _policy.exchanging():
            tx = self.root_tx
            key = f"{KEY} {frame_key(tx)}" if tx is not None else KEY
            try:
                check_graph(st, key, fingerprint(gm))
            except Error as e:
                st.pending = e
                raise
        return original(self, gm, example_inputs)

    call_user_compiler.__wrapped__ = original
    patch(st, og, "call_user_compiler", call_user_compiler)


def install_spmd_check(st, patch: Callable[..., None]) -> None:
    """Replaces Inductor's ``spmd_check.spmd_check`` (looked up through the
    module at each post-grad pass) with the exchange on the channel."""
    import torch._inductor.fx_passes.spmd_check as spmd

    original = spmd.__dict__["spmd_check"]

    def spmd_check(gm) -> bool:
        channel = st.channel
        if channel.world_size < 2 or not _policy.exchanging():
            # A local compile checks nothing across ranks.
            return True
        own: Optional[int] = spmd._compute_hash(gm)
        exchange = channel.next_exchange
        try:
            hashes = [h[0] for h in channel.gather_texts(SPMD_KEYS[0], [str(own)])]
            if "None" in hashes:
                # torch skips a graph it cannot hash; here every rank skips.
                return True
            if all(h == hashes[0] for h in hashes):
                return True
            entries = [f"{t}\t{m}" for t, m in spmd._build_diag_fingerprint(gm)]
            lists = channel.gather_texts(SPMD_KEYS[1], entries)
        except Error as e:
            st.pending = e
            raise
        fingerprints = [
            tuple((t, None if m == "None" else m) for t, m in (e.split("\t", 1) for e in lines))
            for lines in lists
        ]
        report = spmd._build_mismatch_report(fingerprints, channel.rank, channel.world_size)
        print(report, flush=True)
        log.warning("\n%s", report)
        from torch._inductor import config
        from torch._logging import trace_structured

        trace_structured(
            "artifact",
            metadata_fn=lambda: {"name": "inductor_spmd_graph_mismatch", "encoding": "string"},
            payload_fn=lambda: report,
        )
        if config.aten_distributed_optimizations.spmd_mismatch == "error":
            e = GraphMismatch(
                "Inductor's SPMD check: the ranks' post-grad graphs differ "
                f"(spmd_mismatch='error'):\n{report}",
                groups=groups_by_value(hashes, st.ranks),
                key=SPMD_KEYS[0], exchange=exchange, last_completed=channel.next_exchange - 1,
            )
            st.pending = e
            raise e
        return False

    spmd_check.__wrapped__ = original
    patch(st, spmd, "spmd_check", spmd_check)
