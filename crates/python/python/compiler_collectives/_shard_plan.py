"""The plan of a sharded compile's round (docs/python.md, "Sharded
compilation"; ``_shard`` runs it): who builds each kernel, who takes it
over, and where its files go. Pure functions of what the round's
exchanges gathered, so every rank computes them alike. Imports nothing of
torch.

`needs` is, for each channel rank of the group, the kernels its cache
directory lacks: key -> ``[cost, outputs]`` (cost: bytes of source;
outputs: paths relative to the cache directory, none for Triton). A key
that starts with :data:`TRITON_PREFIX` is a Triton kernel's."""

from __future__ import annotations

from typing import Optional

#: The prefix of a Triton kernel's key (``_shard.triton_key``).
TRITON_PREFIX = "triton_"


def _costs(needs: dict[int, dict[str, list]], ranks: list[int]) -> dict[str, int]:
    """Each needed kernel's cost: the largest any rank of `ranks` gave."""
    cost: dict[str, int] = {}
    for r in ranks:
        for key, (c, _) in needs[r].items():
            cost[key] = max(cost.get(key, 0), int(c))
    return cost


def assign(needs: dict[int, dict[str, list]], ranks: list[int], groups: list[frozenset],
           loads: Optional[dict[int, int]] = None,
           ) -> tuple[dict[str, int], list[tuple[int, int, list[str]]]]:
    """The plan of one round, the same on every rank: `needs` (rank ->
    kernel key -> [cost, outputs]) of `ranks` (the group, ascending), each
    rank's cache-directory group, and each rank's `loads` (the cost it built
    in earlier rounds, so that the rounds of small graphs spread too).
    Returns each needed kernel's source (a rank of the group that has it,
    else the builder: the rank with the least cost so far, the costliest
    kernels first) and the transfers
    ``(source, receiver, keys)``: to one receiver (the lowest rank needing
    one of them) per other directory that needs the source's kernels,
    sources ascending, then receivers. A Triton kernel (``_shard.triton_key``)
    is built by a rank that needs it (a rank that does not holds it in
    memory, its files unknown) and goes to each other rank needing it:
    Triton's cache directory is one per device index, so ranks on one node
    do not share it as a rule. Its transfers follow the C++ kernels'."""
    wanted = _costs(needs, ranks)
    load = {r: (loads or {}).get(r, 0) for r in ranks}
    source: dict[str, int] = {}
    for key in sorted(wanted, key=lambda k: (-wanted[k], k)):
        triton = key.startswith(TRITON_PREFIX)
        holders = [] if triton else [r for r in ranks if key not in needs[r]]
        if holders:
            source[key] = holders[0]
            continue
        builder = min((r for r in ranks if key in needs[r]), key=lambda r: (load[r], r))
        load[builder] += wanted[key]
        source[key] = builder
    return source, plan_transfers(source, needs, ranks, groups)


def plan_transfers(source: dict[str, int], needs: dict[int, dict[str, list]], ranks: list[int],
                   groups: list[frozenset]) -> list[tuple[int, int, list[str]]]:
    """The transfers ``(source, receiver, keys)`` of one round, the same on
    every rank, from each kernel's `source` (the rank that has it or built
    it) and what each rank of `ranks` still `needs`: :func:`assign`'s
    order."""
    transfers = []
    alone = {r: frozenset({r}) for r in ranks}
    for triton, by in ((False, groups), (True, alone)):
        for s in ranks:
            done: set[int] = set()
            for r in ranks:
                if r in by[s] or r in done:
                    continue
                peers = [x for x in ranks if x in by[r]]
                done.update(peers)
                keys = sorted(k for k, src in source.items() if src == s
                              and k.startswith(TRITON_PREFIX) == triton
                              and any(k in needs[x] for x in peers))
                if keys:
                    receiver = min(x for x in peers if any(k in needs[x] for k in keys))
                    transfers.append((s, receiver, keys))
    return transfers


def shares(source: dict[str, int], needs: dict[int, dict[str, list]],
           ranks: list[int]) -> dict[int, list[str]]:
    """Each rank's share of a round from :func:`assign`'s `source`: the
    kernels it is to build (it needs them: a holder builds nothing), the
    costliest first. A rank claims each of its own in that order; a rank
    done with its own takes over the others' from their ends (module docs:
    the claims)."""
    cost = _costs(needs, ranks)
    out: dict[int, list[str]] = {r: [] for r in ranks}
    for key in sorted(source, key=lambda k: (-cost.get(k, 0), k)):
        r = source[key]
        if r in out and key in needs[r]:
            out[r].append(key)
    return out


def settle(source: dict[str, int], needs: dict[int, dict[str, list]],
           built: dict[int, set[str]], ranks: list[int],
           ) -> tuple[dict[str, int], dict[int, dict[str, list]], set[str]]:
    """After the builds of a round, the same on every rank: each kernel's
    source (its holder; else the rank that built it, the planned one where
    several did), what each rank still needs (not what it built itself),
    and the kernels no rank built (each rank needing one builds it as it
    loads it, as without the package)."""
    final: dict[str, int] = {}
    unbuilt: set[str] = set()
    for key, s in source.items():
        if key not in needs[s]:
            final[key] = s
            continue
        by = [r for r in ranks if key in built[r]]
        if by:
            final[key] = s if s in by else by[0]
        else:
            unbuilt.add(key)
    left = {r: {k: v for k, v in needs[r].items() if k not in built[r] and k not in unbuilt}
            for r in ranks}
    return final, left, unbuilt
