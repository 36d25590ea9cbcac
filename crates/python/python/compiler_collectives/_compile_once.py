"""Compile once per job (``enable(compile_once=True)``; docs/python.md,
"Compile once").

At each AOTAutograd cache lookup of an exchanged compile, the ranks of the
group exchange the key they computed and whether they *loaded* it (an
AOTAutograd hit whose FX graph then missed is a miss). Then, for each
distinct key, among the ranks that computed it:

- some rank loaded it: one of those (the *source*) tells the others, and
  sends the files a load needs to the ranks whose cache directory lacks
  them; they install the files and look up again, and nobody compiles;
- no rank loaded it: one rank (the *owner*, each lookup's next rank in
  turn, so that keys spread over the ranks) compiles while the others wait; then it
  sends the files as above;
- ranks whose keys differ each compile their own, as without the package
  (one INFO line per key, counted).

The order of lookups is the same on every rank because the package turns
``torch._functorch.config.force_non_lazy_backward_lowering`` on: the
backward is compiled with the forward, and the AOTAutograd entry is
complete when the forward's compile returns (with it off, a rank that
missed looks the backward's FX graph up at its first ``.backward()``, where
a rank that hit never does).

While the owner compiles, it sends a beat to every waiting rank each
:func:`beat_period` seconds, point to point on the channel; a waiting rank
fails only when the owner is gone (``PeerLost`` naming it, as soon as the
transport sees its connection close) or sends nothing for the exchange
deadline (``Timeout`` naming it). An owner whose compile raises tells every
waiting rank at once (:class:`~compiler_collectives.PeerCompileFailed`).
Inside the owner's compile the agreements that run within a compile (the
partitioner's sync, autotuning, the SPMD check) stand aside: it compiles as
a group of one (``_policy.alone``).

Ranks that share a cache directory (found at the first lookup, and again
whenever a rank's ``cache_dir()`` changes: each rank writes a random token
into its own directory and looks for its peers') move no bytes: they read
the owner's entries from disk. For every other directory, one rank of it
receives the files and tells the others of its directory when they are
installed. Each file travels with the SHA-256 its sender announced; the
receiver checks the digest and the path before anything reaches torch's
loader, and installs atomically (a kernel's shared object under Inductor's
own per-kernel lock). A rank that rejects a transfer, or whose files pass
``max_artifact_bytes``, compiles itself (a WARNING, counted).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import threading
import time
from typing import Any, Optional

from . import _policy, _shard
from ._errors import Error, PeerCompileFailed, Timeout
from ._shipping import (
    CHUNK_BYTES,
    violation,
    KEY,
    MAX_MESSAGE,
    TAG,
    Record,
    _cache_dir,
    _note,
    _note_loaded,
    _note_reused,
    _key_of,
    _recording,
    _Recording,
    count,
    manifest,
    receive_files,
    recv,
    send,
    send_files,
    test_hooks,
)

log = logging.getLogger("compiler_collectives.compile_once")

#: The compile key of the lookup exchange (and of its messages).
LOOKUP_KEY = KEY
#: The compile key of the exchange of cache-directory views.
DIRS_KEY = "torch.compile_once.dirs"
#: The default of ``enable(max_artifact_bytes=...)``: the most bytes of
#: files one key ships (larger: the receiving ranks compile themselves).
DEFAULT_MAX_ARTIFACT_BYTES = 1 << 30
#: Where the package's own files live in a cache directory (the tokens).
OWN_DIR = "compiler_collectives"

_tls = threading.local()

#: Who lowers a graph that no rank loaded: ``"owner"``, the source alone,
#: while the others wait for its files; ``"every"`` (``shard_kernels``),
#: every rank, each kernel built once in the job (``_shard``).
LOWERING = ("owner", "every")


def beat_period(timeout_s: float) -> float:
    """Seconds between an owner's beats: a quarter of the exchange
    deadline, at most 1 s, so that a waiting rank hears several within it."""
    return max(0.01, min(1.0, timeout_s / 4))


class Plan:
    """What every rank of the group does for this lookup, computed alike on
    every rank from what the lookup exchange gathered, and `index` (how many
    lookup exchanges came before this one: the same on every rank). The
    source is the ``index``-th rank of its pool, in turn: the keys of a job
    spread over the ranks evenly, in the order they are compiled. Where no
    rank loaded the key, the pool is the ranks whose cache directory is the
    warmest: a rank's `warmth` is the Inductor FX graph cache hits of the
    compiles it owned, and a directory's the most of its ranks'. A cache
    warmed without ``compile_once`` holds FX graph entries under other
    AOTAutograd keys (``force_non_lazy_backward_lowering`` is in the key),
    so the ranks of a warm directory lower at little cost, and once a warm
    rank's compile has hit, a cold rank lowers nothing while a warm one can.

    Attributes:
        key: this rank's AOTAutograd key ("" where its key computation
            bypassed the cache: it compiles alone).
        ranks: the channel ranks that computed the same key, ascending.
        source: the rank that compiles (``compiling``) or that loaded it
            and sends it (``holders`` is not empty).
        misses: the ranks of ``ranks`` that wait for the source.
        receivers: channel rank -> the ranks of its cache directory that it
            tells when the files are installed; every receiver gets the
            files from the source.
        on_disk: the ranks that read the files from a directory they share
            with the source or a holder.
        lowers: the ranks that lower the graph, by the lowering policy
            (:data:`LOWERING`): under ``"owner"``, the source when no rank
            loaded the key, else none; under ``"every"``, every rank when
            none loaded it (the policy falls back to ``"owner"`` where the
            ranks' keys differ: a rank-specific graph is not sharded).
        lowering: the policy that applied.
    """

    def __init__(self, keys: list[str], loaded: list[bool], groups: list[frozenset],
                 me: int, index: int = 0, lowering: str = "owner",
                 warmth: Optional[list[int]] = None) -> None:
        n = len(keys)
        self.key = keys[me]
        self.ranks = [r for r in range(n) if keys[r] == self.key]
        self.holders = [r for r in self.ranks if loaded[r]]
        pool = self.holders
        if not pool:
            warmth = warmth or [0] * n
            warm = {r: max(warmth[x] for x in groups[r] if x < n) for r in self.ranks}
            top = max(warm.values())
            pool = [r for r in self.ranks if warm[r] == top]
        self.source = pool[index % len(pool)]
        self.compiling = not self.holders
        if lowering not in LOWERING:
            raise ValueError(f"lowering must be one of {LOWERING}, not {lowering!r}")
        if lowering == "every" and len(self.ranks) < n:
            lowering = "owner"
        self.lowering = lowering
        every = lowering == "every" and self.compiling
        #: The ranks that lower the graph (run AOTAutograd and Inductor).
        self.lowers = list(self.ranks) if every else [self.source] if self.compiling else []
        self.misses = [r for r in self.ranks
                       if not loaded[r] and r != self.source and r not in self.lowers]
        have = set(groups[self.source])
        for r in self.holders:
            have |= groups[r]
        self.on_disk = [m for m in self.misses if m in have]
        self.receivers: dict[int, list[int]] = {}
        for m in self.misses:
            if m in have:
                continue
            first = min(x for x in self.misses if x in groups[m])
            peers = self.receivers.setdefault(first, [])
            if m != first:
                peers.append(m)

    def receiver_of(self, rank: int) -> Optional[int]:
        """The receiver of `rank`'s directory (itself when it is one)."""
        for r, peers in self.receivers.items():
            if rank == r or rank in peers:
                return r
        return None


def groups_from_views(views: list[list[str]], n: int) -> list[frozenset]:
    """Each rank's set of ranks sharing its cache directory, from every
    rank's view (the ranks whose tokens it found): the connected ranks,
    each rank with itself, so that the groups are the same seen from any of
    their ranks (views need not be: a token not yet visible over NFS). A
    view naming something other than ranks names no one."""
    parent = list(range(n))

    def root(r: int) -> int:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    for r, view in enumerate(views[:n]):
        for x in (view[0].split(",") if view and view[0] else []):
            if x.isdigit() and int(x) < n:
                parent[root(int(x))] = root(r)
    members: dict[int, set] = {}
    for r in range(n):
        members.setdefault(root(r), set()).add(r)
    return [frozenset(members[root(r)]) for r in range(n)]


class Dirs:
    """This rank's cache directory as the lookups last saw it: its path,
    the token this rank wrote into it, and every rank's directory group
    (None until the ranks compared their views)."""

    def __init__(self) -> None:
        self.root: Optional[str] = None
        self.token = ""
        self.groups: Optional[list[frozenset]] = None

    def current_token(self) -> str:
        """The token of ``cache_dir()``, written there when the directory
        is new to this rank (which makes every rank compare views again)."""
        root = _cache_dir()
        if root != self.root:
            token = secrets.token_hex(12)
            where = os.path.join(root, OWN_DIR, "tokens")
            os.makedirs(where, exist_ok=True)
            with open(os.path.join(where, token), "w") as f:
                f.write(f"{os.getpid()}\n")
            self.root, self.token, self.groups = root, token, None
        return self.token

    def view(self, tokens: list[str]) -> str:
        """The ranks whose token is in this rank's directory."""
        where = os.path.join(self.root or _cache_dir(), OWN_DIR, "tokens")
        return ",".join(str(r) for r, t in enumerate(tokens)
                        if re.fullmatch(r"[0-9a-f]{24}", t) and os.path.exists(
                            os.path.join(where, t)))


class Beats:
    """The beats of a source to the ranks waiting for it: a thread that sends
    each rank of ``peers`` a beat every :func:`beat_period` seconds, while
    the source compiles and, for the receivers still waiting for their
    turn, while it sends the files. ``peers`` changes under ``lock`` only,
    which a beat holds while it is sent, so no beat follows a peer's
    removal."""

    def __init__(self, st, peers: list[int]) -> None:
        self.st, self.peers = st, list(peers)
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ccol-compile-once-beats",
                                       daemon=True)
        self.thread.start()

    def _run(self) -> None:
        period = beat_period(self.st.channel.timeout_s)
        while not self.stop_event.wait(period):
            try:
                with self.lock:
                    for p in self.peers:
                        send(self.st, p, b"B")
            except Exception as e:  # noqa: BLE001 - the waiting ranks fail on their own
                log.debug("compiler_collectives: a compile-once beat failed: %s", e)
                return

    def beat(self, peers: list[int]) -> None:
        """From now on, beats go to `peers` only."""
        with self.lock:
            self.peers = list(peers)

    def stop(self) -> None:
        self.beat([])
        self.stop_event.set()
        if self.thread.is_alive():
            self.thread.join()


class Duty:
    """What this rank owes the waiting ranks of `plan` once its compile (or
    load) of the key is over: beats while it lasts, then the done message
    to every waiting rank and the files to the receivers, or the error."""

    def __init__(self, st, plan: Plan, compiling: bool) -> None:
        self.st, self.plan = st, plan
        self.compiling = compiling
        self.record = Record()
        self.record.key = plan.key
        self.beats = Beats(st, plan.misses) if compiling and plan.misses else None
        self.settled = False

    def fail(self, e: BaseException) -> None:
        """Tells every waiting rank that the compile raised `e`."""
        if self.settled:
            return
        self.settled = True
        if self.beats is not None:
            self.beats.stop()
        self._tell(self.plan.misses, e)

    def _tell(self, ranks: list[int], e: BaseException) -> None:
        body = json.dumps({"type": f"{type(e).__module__}.{type(e).__qualname__}",
                           "message": str(e)[:MAX_MESSAGE]}).encode()
        for m in ranks:
            try:
                send(self.st, m, b"E", body)
            except Exception as err:  # noqa: BLE001 - the rank fails on its own
                log.debug("compiler_collectives: cannot tell rank %d of the failure: %s", m, err)

    def done(self, saved: bool) -> None:
        """Tells every waiting rank the key is ready, then sends the files to
        the receivers in turn (none past ``max_artifact_bytes``), beating the
        receivers still waiting for theirs. A manifest this rank cannot
        make ships nothing (the receivers compile themselves, with the
        reason); an error of the channel reaches the ranks not yet told."""
        if self.settled:
            return
        self.settled = True
        st, plan = self.st, self.plan
        if self.beats is not None:
            self.beats.beat([])
        root, files, why = _cache_dir(), [], None
        try:
            if saved and plan.receivers:
                files = manifest(self.record, root)
        except OSError as e:
            why = f"the source could not list its files: {e}"
        total = sum(f["size"] for f in files)
        ship = saved and bool(plan.receivers) and why is None and total <= st.max_artifact_bytes
        if saved and plan.receivers and why is None and not ship:
            why = (f"its files are {total} bytes, past max_artifact_bytes "
                   f"({st.max_artifact_bytes})")
        body = json.dumps({"saved": saved, "ship": ship, "total": total, "why": why,
                           "files": files if ship else []}).encode()
        if ship:
            log.debug("compiler_collectives: compile_once: key %s: %d files, %d bytes: %s",
                      plan.key, len(files), total, [f["path"] for f in files])
        told: list[int] = []
        try:
            for m in plan.misses:
                send(st, m, b"D", body)
                told.append(m)
            if ship:
                waiting = list(plan.receivers)
                if self.beats is None and len(waiting) > 1:
                    self.beats = Beats(st, [])
                for m in plan.receivers:
                    waiting.remove(m)
                    if self.beats is not None:
                        self.beats.beat(waiting)
                    send_files(st, m, root, files)
                    count("sent")
                    count("bytes_sent", total)
        except BaseException as e:
            self._tell([m for m in plan.misses if m not in told], e)
            raise
        finally:
            if self.beats is not None:
                self.beats.stop()


def _recv_within(st, plan: Plan, started: float) -> tuple[bytes, bytes]:
    """The source's next message, within the exchange deadline and what is
    left of ``compile_timeout`` (``Timeout`` naming the source past it)."""
    limit = st.compile_timeout
    if limit is None:
        return recv(st, plan.source)
    left = limit - (time.perf_counter() - started)
    owner = st.ranks[plan.source] if st.ranks else plan.source
    message = (f"compile_once: job rank {owner} did not finish compiling AOTAutograd key "
               f"{plan.key} within compile_timeout={limit} s")
    if left <= 0:
        raise Timeout(message, missing_ranks=[owner])
    wait = min(st.channel.timeout_s, left)
    try:
        msg = st.channel.recv_bytes(LOOKUP_KEY, plan.source, TAG, CHUNK_BYTES + 1, wait)
    except Timeout:
        if wait < st.channel.timeout_s:
            raise Timeout(message, missing_ranks=[owner]) from None
        raise
    return msg[:1], msg[1:]


def _failed(st, plan: Plan, body: bytes) -> PeerCompileFailed:
    try:
        info = json.loads(body.decode())
        kind, message = str(info["type"]), str(info["message"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        kind, message = "unknown", body[:MAX_MESSAGE].decode(errors="replace")
    owner = st.ranks[plan.source] if st.ranks else plan.source
    return PeerCompileFailed(
        f"compile_once: job rank {owner}, which compiled the graph of AOTAutograd key "
        f"{plan.key} for this rank, failed: {kind}: {message}",
        owner=owner, compile_key=plan.key, exc_type=kind, exc_message=message,
    )


def _wanted(st) -> bool:
    """Whether this lookup takes part: ``compile_once`` on, a group of
    more than one rank, an exchanged compile (not ``local()``, not inside
    an owner's compile)."""
    return st.compile_once and st.channel.world_size >= 2 and _policy.exchanging()


def _fx_hits() -> int:
    """This process's Inductor FX graph cache hits so far: the counter
    ``codecache.py`` increments at each hit in torch 2.11-2.15 (read from
    their sources). Were a version to stop counting, every rank's warmth
    would read 0 and owners would go in turn over all ranks: slower,
    never wrong."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["fxgraph_cache_hit"])


def _exchange(st, key: str, loaded: bool):
    """The lookup exchange: every rank's key, whether it loaded it and its
    warmth (:class:`Plan`), and (when a rank's cache directory is new to
    it) every rank's view of who shares its directory. Returns the keys,
    the loads, the directory groups and the warmths, by channel rank."""
    dirs: Dirs = st.compile_once_dirs
    token = dirs.current_token()
    rows = st.channel.gather_texts(
        LOOKUP_KEY, [key, "1" if loaded else "0", token, "?" if dirs.groups is None else "=",
                     str(st.compile_once_warmth)])
    n = len(rows)
    keys = [r[0] if r else "" for r in rows]
    loaded_all = [bool(r) and len(r) > 1 and r[1] == "1" for r in rows]
    warmth = [int(r[4]) if len(r) > 4 and r[4].isdigit() and len(r[4]) < 16 else 0
              for r in rows]
    if any(len(r) < 4 or r[3] != "=" for r in rows):
        tokens = [r[2] if len(r) > 2 else "" for r in rows]
        views = st.channel.gather_texts(DIRS_KEY, [dirs.view(tokens)])
        dirs.groups = groups_from_views(views, n)
        log.debug("compiler_collectives: compile_once: cache directories shared by ranks %s",
                  sorted({tuple(sorted(g)) for g in dirs.groups}))
    return keys, loaded_all, dirs.groups, warmth


def _device_note() -> str:
    """Why keys may differ by rank on CUDA: each holds the rank's device."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return ""
    from . import _checks

    for path in ("torch.compiler.config.compile_on_one_rank",
                 "torch.distributed.config.compile_on_one_rank"):
        module, name = path.rsplit(".", 1)
        try:
            if getattr(_checks.resolve(module), name):
                return ""
            break
        except (ImportError, AttributeError):
            continue
    return (" (on CUDA a key holds its device, cuda:N: ranks share a graph only with the same "
            "device index, across nodes, unless torch.compiler.config.compile_on_one_rank is on)")


def _log_rank_specific(st, plan: Plan, keys: list[str]) -> None:
    """Once per key on each rank of it: the ranks computed different keys
    (the INFO line names the groups of ranks; counted)."""
    if len(plan.ranks) == len(keys) or plan.key in st.compile_once_specific:
        return
    st.compile_once_specific.add(plan.key)
    job = (lambda r: st.ranks[r]) if st.ranks else (lambda r: r)
    groups: dict[str, list[int]] = {}
    for r, k in enumerate(keys):
        groups.setdefault(k or "(bypassed the cache)", []).append(job(r))
    count("rank_specific")
    log.info("compiler_collectives: compile_once: the ranks computed different AOTAutograd keys "
             "(a graph that holds something rank-specific); each group shares its own: %s%s",
             "; ".join(f"job ranks {g}" for g in groups.values()), _device_note())


def _log_key(st, plan: Plan, what: str) -> None:
    job = st.ranks[plan.source] if st.ranks else plan.source
    if plan.lowering == "every" and plan.compiling:
        log.info("compiler_collectives: compile_once: key %s: %s", plan.key, what)
        return
    log.info("compiler_collectives: compile_once: key %s: %s (job rank %s %s)", plan.key, what,
             job, "compiles" if plan.compiling else "loaded it")


def check_settings() -> None:
    """At each lookup: the settings ``compile_once`` relies on are as
    ``enable`` left them — the backward lowered with the forward, no pass
    that bakes the rank into a graph after its key (``torch.compile``'s
    ``options=`` patch Inductor's config per compile). ``InvalidArgument``
    naming each otherwise (nothing is exchanged)."""
    from . import _checks
    from ._errors import InvalidArgument

    import torch._functorch.config as functorch_config

    wrong = []
    if functorch_config.force_non_lazy_backward_lowering is not True:
        wrong.append("torch._functorch.config.force_non_lazy_backward_lowering="
                     f"{functorch_config.force_non_lazy_backward_lowering!r} (compile_once "
                     "needs True)")
    for path, off in _checks.RANK_BAKING_PASSES:
        module, name = path.rsplit(".", 1)
        try:
            value = getattr(_checks.resolve(module), name, off)
        except (ImportError, AttributeError):
            continue
        if value != off:
            wrong.append(f"{path}={value!r} (bakes the rank into a graph after its key)")
    if wrong:
        raise InvalidArgument("compile_once: a setting changed after enable(): "
                              + "; ".join(wrong) + ". Leave them as enable() found them.")


def make_try_load(st, original):
    """Wraps ``AOTAutogradCache.try_load``: the lookup, then the exchange
    and this rank's part of the plan (module docs)."""

    def try_load(*args: Any, **kwargs: Any):
        if not _wanted(st):
            return original(*args, **kwargs)
        check_settings()
        # An owed compile that never ran (no AOTAutograd stage 2 followed
        # its lookup): its waiting ranks get an error, not a wait.
        abandon(Error("compile_once: this rank's compile of a graph other ranks waited for "
                      "never ran (AOTAutograd stopped after the cache lookup)"))
        rec = Record()
        try:
            with _Recording(rec):
                compiled_fn, aot_config = original(*args, **kwargs)
        except BaseException:
            # torch raised (its strict cache modes): the peers still get
            # this rank's part of the exchange, a bypass.
            _exchange(st, "", False)
            st.compile_once_lookups += 1
            raise
        keys, loaded, groups, warmth = _exchange(st, rec.key or "", compiled_fn is not None)
        index = st.compile_once_lookups
        st.compile_once_lookups += 1
        me = st.channel.rank
        if not keys[me]:
            count("bypassed")
            if any(keys):
                # The others share what they compile; this rank compiles
                # alone, as a group of one.
                _tls.duty = Duty(st, Plan([""], [False], [frozenset({0})], 0), compiling=False)
            return compiled_fn, aot_config
        plan = Plan(keys, loaded, groups, me, index, warmth=warmth,
                    lowering="every" if st.shard_kernels else "owner")
        _log_rank_specific(st, plan, keys)
        if plan.lowering == "every" and me in plan.lowers:
            _log_key(st, plan, "lowering on every rank, each kernel to be built once in the job")
            count("compiled")
            _tls.sharding = _shard.Sharding(st, plan.key, groups)
            return compiled_fn, aot_config
        if me == plan.source:
            if me in plan.lowers:
                _log_key(st, plan, "compiled here")
                count("compiled")
                _tls.duty = Duty(st, plan, compiling=True)
                return compiled_fn, aot_config
            count("loaded_here")
            duty = Duty(st, plan, compiling=False)
            duty.record = rec
            _log_key(st, plan, "loaded here" + (", told the ranks that missed it"
                                                if plan.misses else ""))
            duty.done(saved=True)
            return compiled_fn, aot_config
        if compiled_fn is not None:
            count("loaded_here")
            job = st.ranks[plan.source] if st.ranks else plan.source
            log.info("compiler_collectives: compile_once: key %s: loaded here, from this "
                     "rank's own cache (job rank %s sends it to the ranks that missed it, if "
                     "any)", plan.key, job)
            return compiled_fn, aot_config
        return _wait_and_load(st, plan, keys, original, args, kwargs, aot_config)

    try_load.__wrapped__ = original
    return try_load


_warming = False


def warm_up() -> None:
    """What a process's first load of an Inductor CPU graph pays before it
    can load anything — its vector ISA, which Inductor finds by building
    test programs and loading each in a Python subprocess (seconds) — done
    in a thread of its own while this rank waits for an owner, once per
    process. Not on a CUDA job (its graphs need no vector ISA)."""
    global _warming
    if _warming:
        return
    _warming = True
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return

    def run() -> None:
        try:
            from torch._inductor import cpu_vec_isa

            cpu_vec_isa.pick_vec_isa()
        except Exception as e:  # noqa: BLE001 - the load finds it again, or fails itself
            log.debug("compiler_collectives: compile_once: warm-up failed: %s", e)

    threading.Thread(target=run, name="ccol-compile-once-warm-up", daemon=True).start()


def _wait_and_load(st, plan: Plan, keys, original, args, kwargs, aot_config):
    """A rank that missed: waits for the source (beats while it compiles),
    receives or reads the files, and looks up again; compiles alone where
    that cannot be done."""
    started = time.perf_counter()
    if plan.compiling:
        warm_up()
    while True:
        kind, body = _recv_within(st, plan, started)
        if kind == b"B":
            continue
        if kind == b"E":
            raise _failed(st, plan, body)
        if kind == b"D":
            break
        raise violation(st, f"rank {plan.source} sent a message of kind {kind!r} where the end "
                            "of its compile was expected")
    try:
        info = json.loads(body.decode())
        if not isinstance(info, dict):
            raise ValueError("not an object")
    except (ValueError, UnicodeDecodeError) as e:
        raise violation(st, f"rank {plan.source}'s done message does not decode: {e}") from None
    me = st.channel.rank
    ok = bool(info.get("saved"))
    how = "read from a shared cache directory"
    if not ok:
        log.info("compiler_collectives: compile_once: key %s was not saved by its source (not "
                 "cacheable): this rank compiles it itself", plan.key)
    elif me in plan.receivers:
        if not info.get("ship"):
            log.warning("compiler_collectives: compile_once: key %s was not sent (%s): this rank "
                        "compiles it itself", plan.key, info.get("why"))
            ok = False
        else:
            ok = receive_files(st, plan.source, info, plan.key)
            how = "received"
        for peer in plan.receivers[me]:
            send(st, peer, b"I" if ok else b"F")
    elif me not in plan.on_disk:
        receiver = plan.receiver_of(me)
        if receiver is not None:
            kind, _ = recv(st, receiver)
            if kind not in (b"I", b"F"):
                raise violation(st, f"rank {receiver} sent a message of kind {kind!r} where "
                                    "the end of its install was expected")
            ok = kind == b"I"
    waited = time.perf_counter() - started
    if ok:
        rec = Record()
        with _Recording(rec):
            compiled_fn, aot_config = original(*args, **kwargs)
        shipped = {f.get("path") for f in info.get("files", []) if isinstance(f, dict)}
        root = os.path.realpath(_cache_dir())
        built = [p for p in rec.libraries
                 if os.path.relpath(os.path.realpath(p), root).replace(os.sep, "/") not in shipped]
        if built and how == "received":
            # Their keys differ here (the compile command: include paths,
            # vector ISA, compiler), or the sender had loaded them before,
            # for another graph, and so did not note them.
            count("kernel_misses", len(built))
            log.info("compiler_collectives: compile_once: key %s loaded %d kernels it was not "
                     "sent (another compile command here, or kernels the sender loaded for an "
                     "earlier graph): %s", plan.key, len(built), built)
        if compiled_fn is not None:
            count("received" if how == "received" else "loaded_shared")
            log.info("compiler_collectives: compile_once: key %s %s and loaded (job rank %s "
                     "%s; %.2f s waiting and receiving, %.2f s loading)", plan.key, how,
                     st.ranks[plan.source] if st.ranks else plan.source,
                     "compiled it" if plan.compiling else "had it", waited,
                     time.perf_counter() - started - waited)
            return compiled_fn, aot_config
        log.warning("compiler_collectives: compile_once: key %s did not load after the "
                    "transfer (its lookup missed): this rank compiles it itself", plan.key)
    count("fell_back")
    _tls.duty = Duty(st, Plan([plan.key], [False], [frozenset({0})], 0), compiling=False)
    return None, aot_config


def make_stage2(original):
    """Wraps ``aot_stage2_compile``: where this rank owes a compile to
    waiting ranks (or compiles after a fallback), runs it as a group of one
    with beats to them, then settles (done with the files, or the error)."""

    def aot_stage2_compile(*args: Any, **kwargs: Any):
        sharding = getattr(_tls, "sharding", None)
        if sharding is not None:
            _tls.sharding = None
            return _shard.run(sharding, original, *args, **kwargs)
        duty: Optional[Duty] = getattr(_tls, "duty", None)
        if duty is None:
            return original(*args, **kwargs)
        _tls.duty = None
        try:
            with _Recording(duty.record), _policy.alone():
                if duty.compiling and test_hooks.get("in_owner_compile"):
                    test_hooks["in_owner_compile"]()
                hits = _fx_hits()
                result = original(*args, **kwargs)
                if duty.compiling:
                    duty.st.compile_once_warmth += _fx_hits() - hits
        except BaseException as e:
            duty.fail(e)
            raise
        duty.done(saved=duty.record.saved)
        return result

    aot_stage2_compile.__wrapped__ = original
    return aot_stage2_compile


def abandon(e: BaseException) -> None:
    """A compile ended with `e` before this rank's owed compile ran (Dynamo
    raised between the lookup and the compile): the waiting ranks get the
    error. Called by ``_policy``'s compile wrapper."""
    duty: Optional[Duty] = getattr(_tls, "duty", None)
    if duty is not None:
        _tls.duty = None
        duty.fail(e)
    sharding = getattr(_tls, "sharding", None)
    if sharding is not None:
        _tls.sharding = None
        sharding.finish(e)


def install(st, patch) -> None:
    """Puts compile-once on AOTAutograd's cache (``patch(st, owner, name,
    value)`` records each undo) and turns
    ``force_non_lazy_backward_lowering`` on until ``disable``."""
    import torch._functorch.aot_autograd as aot_autograd
    import torch._functorch.config as functorch_config
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
    from torch._inductor.codecache import CppCodeCache, FxGraphCache

    st.compile_once_dirs = Dirs()
    patch(st, functorch_config, "force_non_lazy_backward_lowering", True)
    try_load = AOTAutogradCache.__dict__["try_load"].__func__
    patch(st, AOTAutogradCache, "try_load", staticmethod(make_try_load(st, try_load)))
    patch(st, aot_autograd, "aot_stage2_compile", make_stage2(aot_autograd.aot_stage2_compile))

    def noting(owner, name: str, what: str, arg: int, kind) -> None:
        raw = owner.__dict__[name]
        fn = raw.__func__

        def wrapper(*args: Any, **kwargs: Any):
            if _recording():
                _note(what, args[arg] if len(args) > arg else None)
            return fn(*args, **kwargs)

        wrapper.__wrapped__ = fn
        patch(st, owner, name, kind(wrapper))

    noting(AOTAutogradCache, "_lookup", "key", 0, staticmethod)
    noting(AOTAutogradCache, "save", "saved", 0, staticmethod)
    noting(FxGraphCache, "_lookup_graph", "fx", 0, staticmethod)
    noting(FxGraphCache, "_save_graph", "fx", 0, staticmethod)

    load_library = CppCodeCache.__dict__["_load_library"].__func__

    def loading(cls, path, key, *args: Any, **kwargs: Any):
        _note_loaded(path, key)
        return load_library(cls, path, key, *args, **kwargs)

    loading.__wrapped__ = load_library
    patch(st, CppCodeCache, "_load_library", classmethod(loading))
    load_async = CppCodeCache.__dict__.get("load_async")
    if load_async is not None:
        load_async = load_async.__func__

        def reusing(cls, *args: Any, **kwargs: Any):
            fn = load_async(cls, *args, **kwargs)
            _note_reused(cls.cache, fn)
            sharding = _shard.active()
            if sharding is not None:
                sharding.note(_key_of(cls.cache, fn))
            return fn

        reusing.__wrapped__ = load_async
        patch(st, CppCodeCache, "load_async", classmethod(reusing))
    if st.shard_kernels:
        _shard.install(st, patch)
