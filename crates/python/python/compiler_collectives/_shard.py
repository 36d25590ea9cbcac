"""Sharded compilation: ``enable(compile_once=True, shard_kernels=True)``
(docs/python.md, "Sharded compilation").

Where every rank of the group computed the same AOTAutograd key and none
loaded it, compile-once's lowering policy becomes "every rank lowers"
(``_compile_once.Plan``, lowering ``"every"``) and the C++ kernels of each
Inductor graph are built once in the job:

- While a graph's wrapper module is imported, Inductor submits each
  kernel's build to its pool (``AsyncCompile.submit``, with
  ``compile_threads >= 2``). Here the build is held: the submission returns
  a future that is not done, and the kernel is noted (its key, the name of
  its lock file; its output files; its cost, the bytes of its sources).
- ``AsyncCompile.wait``, the module's last line, knows every kernel of the
  graph. There the ranks take a *round* of three exchanges on the whole
  group, each waiting ``compile_timeout`` (or :data:`DEFAULT_WAIT_S` where
  it is None; not the channel's ``timeout``) for
  the slowest rank:

  1. every rank's list: the digest of the kernel keys the module named,
     and the kernels it must build or get (those its cache directory
     lacks). Ranks whose digests differ shard apart (an INFO line naming
     the groups, ``shard_kernels_lists_differ``); a group of one builds
     its own. A kernel some rank of the group already has is sent by that
     rank; every other kernel goes to the share of the rank with the least
     cost so far (the longest first), so that no rank gets all the big
     ones (``_shard_plan``).
  2. after each rank built what it claimed (on Inductor's pool): the
     kernels it built, or the build that raised. Every rank then raises
     on a failure: the builder its own exception, the others
     :class:`PeerCompileFailed` naming the kernel's key and the builder,
     with its message.
  3. after the transfers, in one order every rank computes alike (each
     source to one receiver per other cache directory, digest-checked;
     a rejected transfer is built by its receiver, with a WARNING): the
     files are in every directory. The held futures are then resolved and
     Inductor loads each kernel as a cache hit.

The claims. A rank builds a kernel only once it has claimed it in the
job's store (the default process group's: an ``add`` on a key of the
round, of the group's kernel list and of the kernel, under the channel's
prefix; the first ``add`` wins), each as a slot of its pool frees: first
its own share in order, then, once that is done, the other ranks' shares
from their ends, each up to the first kernel someone else claimed, and
never an owner's first (every rank builds a share). So a rank whose
builds run slower (a busy node, a cost the source's length misjudged) has
the end of its share (past the kernels it claimed at once, one per pool
slot) taken over by the ranks done with theirs
(``shard_kernels_taken_over``). Uneven lowering is waited for at the first
exchange, before any claim. Every kernel then comes
from the rank that built it. A store that cannot ``add`` (a WARNING) leaves
each rank its own share, as planned; a kernel no rank built is built by
each rank needing it as it loads it (``shard_kernels_fell_back``, a
WARNING).

A rank whose compile ends (or raises) answers every later exchange with
"done" until every rank is done, so ranks whose compiles take different
numbers of rounds (a module one rank already holds in memory) stay in
step; a rank whose compile raised says so, and the others raise
:class:`PeerCompileFailed` once every rank is done.

Triton kernels (CUDA) take the same rounds, with three differences:

- a Triton kernel's key is :func:`triton_key` (its source without the
  device index), and its files are not known before it is built: its
  builder sends every Triton cache entry its builds of the round wrote
  (each JSON file's naming of the entry's directory replaced, and written
  back by the receiver, as Inductor's Triton bundler does);
- it goes to every other rank needing it, since Triton's cache directory is
  one per device index;
- the receiver then calls ``AsyncCompile.triton`` as Inductor would: the
  compile finds the entries in Triton's cache (or builds the kernel, where
  none arrived), and the held future is set to the kernel.

CPU CI cannot run Triton: ``tests/test_shard.py`` runs these rounds with a
stand-in for Triton's compile (the test hook ``shard_triton``), and
``scripts/gpu-check.sh`` runs them on a GPU.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Optional

from ._errors import Error, PeerCompileFailed
from ._shard_plan import TRITON_PREFIX, assign, plan_transfers, settle, shares
from ._shipping import MAX_MESSAGE, TAG, _cache_dir, _digest, count, receive_files, recv, send, \
    send_files, test_hooks, violation

log = logging.getLogger("compiler_collectives.compile_once")

#: The compile key of a round's exchanges.
ROUND_KEY = "torch.shard_kernels"
#: The tag of the kernels' transfers (compile-once's own messages use TAG).
SHARD_TAG = TAG + 1
#: The counters' prefix: ``counters["compiler_collectives"]["shard_kernels_*"]``.
PREFIX = "shard_kernels"
#: Seconds a round's exchange waits for the slowest rank when
#: ``compile_timeout`` is None: the ranks' lowerings and builds end at
#: different times. A rank that is gone is found sooner (``PeerLost``).
DEFAULT_WAIT_S = 3600.0

# A kernel key (the name of its lock file), and a kernel's output file
# relative to the cache directory.
_KEY = re.compile(r"^[A-Za-z0-9_]{1,128}$")
_OUTPUT = re.compile(r"^[A-Za-z0-9_]{2}/[A-Za-z0-9_.-]{1,200}\.s?o$")

#: The function in which Inductor submits each Triton kernel early, while it
#: writes the graph's module, where its pool is warm, discarding what
#: ``AsyncCompile.triton`` returns (``TritonScheduling._emit_kernel_to_wrapper``,
#: torch 2.11-2.15, in the version table): in a sharded compile that call
#: builds nothing, and the module's own call is held instead. Every other
#: caller but the module (autotuning, fusion benchmarks, combo kernels) needs
#: the kernel at once and gets it built here, as without the package.
PRESUBMIT = "_emit_kernel_to_wrapper"
_DEVICE_INDEX = re.compile(r"(DeviceProperties\(type='[A-Za-z]+', index=)(\d+)")
# A file of a Triton cache entry, relative to the Triton cache directory,
# and an entry's directory.
_TRITON_FILE = re.compile(r"^[A-Za-z0-9_=-]{8,128}/[A-Za-z0-9_.-]{1,200}$")
_TRITON_ENTRY = re.compile(r"^[A-Za-z0-9_=-]{8,128}$")
#: What a sent Triton entry's JSON files hold where they named the entry's
#: directory (by its absolute path, as Triton writes them); the receiver
#: writes its own directory there. Inductor's Triton bundler does the same.
DIR_MARK = b"[compiler-collectives-triton-entry]"

_tls = threading.local()


def active() -> Optional["Sharding"]:
    """The sharded compile this thread is in, if any."""
    return getattr(_tls, "sharding", None)


class Kernel:
    """One held build: `key`, the `task` Inductor submitted (a C++ kernel's:
    it builds every missing output under the kernel's lock; a Triton
    kernel's: the arguments of ``AsyncCompile.triton`` after ``self``), its
    `outputs` relative to the cache directory (none for Triton: they are
    known once built), its `cost` (bytes of source), its CUDA `device`
    index (None for C++) and the `future` Inductor waits on."""

    __slots__ = ("key", "task", "outputs", "cost", "device", "future")

    def __init__(self, key: str, task: Any, outputs: list[str], cost: int,
                 device: Optional[int] = None) -> None:
        self.key, self.task, self.outputs, self.cost = key, task, outputs, cost
        self.device = device
        self.future: concurrent.futures.Future = concurrent.futures.Future()


def triton_key(source: str) -> str:
    """A Triton kernel's key in a round: :data:`TRITON_PREFIX` and 40 hex
    digits of the SHA-256 of its source (``AsyncCompile.triton``'s
    argument) with the device index left out, so that ranks on ``cuda:0``
    and ``cuda:3`` name one kernel alike: the index is in the source's
    ``DeviceProperties`` only, and Triton's own cache key has none."""
    norm = _DEVICE_INDEX.sub(r"\g<1>N", source)
    return TRITON_PREFIX + hashlib.sha256(norm.encode()).hexdigest()[:40]


def _kernel_of(task: Any, root: str) -> Optional[Kernel]:
    """The held build of a task Inductor submitted, or None where it is not
    a C++ kernel's build (``codecache._worker_compile_cpp(lock_path,
    builders)``) of this cache directory."""
    func, args = getattr(task, "func", None), getattr(task, "args", ())
    if getattr(func, "__name__", "") != "_worker_compile_cpp" or len(args) != 2:
        return None
    lock_path, builders = args
    key = os.path.basename(str(lock_path))
    key = key[:-len(".lock")] if key.endswith(".lock") else ""
    if not _KEY.match(key):
        return None
    outputs, cost = [], 0
    try:
        for b in builders:
            full = os.path.realpath(b.get_target_file_path())
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            if not _OUTPUT.match(rel):
                return None
            outputs.append(rel)
            source = os.path.splitext(full)[0] + ".cpp"
            cost += os.path.getsize(source) if os.path.exists(source) else 0
    except (AttributeError, TypeError, OSError, ValueError):
        return None
    return Kernel(key, task, outputs, max(cost, 1))


class Sharding:
    """One AOTAutograd compile lowered on every rank, its kernels sharded:
    the builds held since the last round, the kernel keys the graph's
    module named, and the rounds taken."""

    def __init__(self, st, key: str, groups: list[frozenset]) -> None:
        self.st, self.key, self.groups = st, key, groups
        self.held: list[Kernel] = []
        self.seen: list[str] = []
        self.rounds = 0
        self.peer_error: Optional[tuple[int, str, str]] = None
        self.wait_s = st.compile_timeout if st.compile_timeout is not None else DEFAULT_WAIT_S
        self.tally = {"built": 0, "received": 0, "fell_back": 0, "taken_over": 0,
                      "seconds": 0.0, "building": 0.0, "waiting": 0.0}
        # Whether kernels are claimed through the job's store (module docs):
        # off where enable() kept none, or once a claim raised.
        self.claiming = getattr(st, "store", None) is not None
        self.root = os.path.realpath(_cache_dir())
        self.triton_new: dict[int, set[str]] = {}

    # Inductor's side: the held builds and the keys its module named.

    def hold(self, task: Any) -> Optional[concurrent.futures.Future]:
        kernel = _kernel_of(task, self.root)
        if kernel is None:
            return None
        self.held.append(kernel)
        return kernel.future

    def note(self, key: str) -> None:
        self.seen.append(key)

    def hold_triton(self, args: tuple) -> concurrent.futures.Future:
        """Holds ``AsyncCompile.triton(*args)`` (``self``, the kernel's
        name, its source, the device string) until the round."""
        source = args[2]
        key = triton_key(source)
        self.seen.append(key)
        index = _DEVICE_INDEX.search(source)
        kernel = Kernel(key, args, [], max(len(source), 1),
                        device=int(index.group(2)) if index else 0)
        self.held.append(kernel)
        return kernel.future

    # The exchanges.

    def _gather(self, texts: list[str]) -> list[list[str]]:
        started = time.monotonic()
        rows = self.st.channel.gather_texts(ROUND_KEY, texts, timeout_s=self.wait_s)
        self.tally["waiting"] += time.monotonic() - started
        for r, row in enumerate(rows):
            if row[:2] == ["done", "err"] and self.peer_error is None and len(row) >= 4:
                self.peer_error = (r, row[2][:MAX_MESSAGE], row[3][:MAX_MESSAGE])
        return rows

    def _job(self, r: int) -> int:
        return self.st.ranks[r] if self.st.ranks else r

    def round(self) -> None:
        """At ``AsyncCompile.wait``: the round of the builds held since the
        last one (module docs). The held futures are resolved (set to
        this round's outcome) whatever happens."""
        held, self.held = self.held, []
        seen, self.seen = self.seen, []
        self.rounds += 1
        started = time.monotonic()
        try:
            self._round(held, seen)
        except BaseException as e:
            for k in held:
                if not k.future.done():
                    k.future.set_exception(e)
            raise
        for k in held:
            if not k.future.done():
                k.future.set_result(None)
        self.tally["seconds"] += time.monotonic() - started

    def _count(self, name: str, n: int) -> None:
        count(name, n, PREFIX)
        self.tally[name] += n

    def _round(self, held: list[Kernel], seen: list[str]) -> None:
        me = self.st.channel.rank
        digest = hashlib.sha256("\n".join(sorted(set(seen))).encode()).hexdigest()[:32]
        differs = test_hooks.get("shard_list_differs")
        if differs is True or differs == self.rounds:
            digest = "x" + digest[1:]
        needs = {k.key: [k.cost, k.outputs] for k in held}
        exchange = self.st.channel.next_exchange
        rows = self._gather(["r", digest, json.dumps(needs, sort_keys=True),
                             str(self.st.shard_load)])
        active = [r for r, row in enumerate(rows) if row[:1] == ["r"] and len(row) == 4]
        ranks = [r for r in active if rows[r][1] == digest]
        if len(ranks) < len(active):
            by: dict[str, list[int]] = {}
            for r in active:
                by.setdefault(rows[r][1], []).append(self._job(r))
            count("lists_differ", prefix=PREFIX)
            log.info("compiler_collectives: shard_kernels: key %s: the ranks' kernel lists "
                     "differ; each group builds its own: %s", self.key,
                     "; ".join(f"job ranks {g}" for g in by.values()))
        need_of = {r: self._needs(r, rows[r][2]) for r in ranks}
        loads = {r: int(rows[r][3]) if rows[r][3].isdigit() and len(rows[r][3]) < 19 else 0
                 for r in ranks}
        source, _ = assign(need_of, ranks, self.groups, loads)
        self.triton_new = {}
        started = time.monotonic()
        space = f"{self.st.store_prefix}/shard/{exchange}/{digest}"
        built, taken, failure = self._build_claimed(
            shares(source, need_of, ranks), {k.key: k for k in held}, space)
        self.tally["building"] += time.monotonic() - started
        self.st.shard_load += sum(k.cost for k in built)
        text = ["ok", json.dumps(sorted(k.key for k in built))] if failure is None else [
            "err", failure[0], f"{type(failure[1]).__module__}.{type(failure[1]).__qualname__}",
            str(failure[1])[:MAX_MESSAGE]]
        rows = self._gather(text)
        self._release(space, taken)
        if failure is not None:
            raise failure[1]
        for r in ranks:
            if rows[r][:1] == ["err"] and len(rows[r]) == 4:
                raise PeerCompileFailed(
                    f"shard_kernels: job rank {self._job(r)} failed to build kernel "
                    f"{rows[r][1]} of AOTAutograd key {self.key}, which this rank loads: "
                    f"{rows[r][2]}: {rows[r][3]}",
                    owner=self._job(r), compile_key=rows[r][1][:MAX_MESSAGE],
                    exc_type=rows[r][2][:MAX_MESSAGE], exc_message=rows[r][3][:MAX_MESSAGE])
        final, left, unbuilt = settle(
            source, need_of, {r: self._built(r, rows[r], need_of[r]) for r in ranks}, ranks)
        self._count("built", len(built))
        self._count("taken_over", sum(1 for k in built if source.get(k.key) != me))
        self._transfer(held, left, final, plan_transfers(final, left, ranks, self.groups))
        self._gather(["placed"])
        lacking = [k for k in held if k.key in unbuilt]
        if lacking:
            log.warning("compiler_collectives: shard_kernels: no rank built kernels %s: this "
                        "rank builds them as it loads them", sorted(k.key for k in lacking))
            self._count("fell_back", len(lacking))
        self._load_triton([k for k in held if k.device is not None and not k.future.done()])

    def _built(self, r: int, row: list[str], needs: dict[str, list]) -> set[str]:
        """The kernels channel rank `r` says it built (its row of a round's
        second exchange), checked: only kernels it needed."""
        try:
            keys = json.loads(row[1]) if row[:1] == ["ok"] and len(row) == 2 else None
        except ValueError:
            keys = None
        if not isinstance(keys, list) or not all(isinstance(k, str) and k in needs
                                                 for k in keys):
            raise violation(self.st, f"job rank {self._job(r)} sent a list of built kernels "
                                     "this rank cannot read")
        return set(keys)

    def _needs(self, r: int, text: str) -> dict[str, list]:
        """Rank `r`'s kernels to build or get, checked (a peer's text)."""
        try:
            needs = json.loads(text)
            ok = isinstance(needs, dict) and all(
                isinstance(k, str) and _KEY.match(k) and isinstance(v, list) and len(v) == 2
                and isinstance(v[0], int) and not isinstance(v[0], bool) and v[0] >= 0
                and isinstance(v[1], list) and all(
                    isinstance(o, str) and _OUTPUT.match(o) and os.path.basename(o)
                    .startswith(k) for o in v[1])
                for k, v in needs.items())
        except ValueError:
            ok = False
        if not ok:
            raise violation(self.st, f"job rank {self._job(r)} sent a list of kernels this "
                                     "rank cannot read")
        return needs

    def _build_claimed(self, segs: dict[int, list[str]], mine: dict[str, Kernel], space: str,
                       ) -> tuple[list[Kernel], list[str], Optional[tuple[str, BaseException]]]:
        """Builds what this rank claims (module docs: the claims): its own
        share in order, then the others' from their ends, each kernel
        claimed in the job's store under `space` as a pool slot frees. The
        kernels built, the keys claimed, the first failure."""
        me = self.st.channel.rank
        taken: list[str] = []

        def claimed(key: str, own: bool) -> bool:
            if not self.claiming:
                return own
            try:
                won = int(self.st.store.add(f"{space}/{key}", 1)) == 1
            except Exception as e:  # noqa: BLE001 - the planned shares still hold
                self.claiming = False
                log.warning("compiler_collectives: shard_kernels: cannot claim kernels through "
                            "the job's store (%s: %s): each rank builds its own share",
                            type(e).__name__, e)
                return own
            if won:
                taken.append(key)
            return won

        def claims():
            for key in segs.get(me, []):
                if claimed(key, True):
                    yield mine[key]
            order = sorted(segs)
            at = order.index(me) if me in order else 0
            for owner in order[at + 1:] + order[:at]:
                # An owner's first kernel is its own: every rank builds a share.
                for key in reversed(segs[owner][1:]):
                    if key not in mine:
                        continue
                    if not claimed(key, False):
                        break
                    yield mine[key]

        built, failure = self._build(claims())
        return built, taken, failure

    def _release(self, space: str, keys: list[str]) -> None:
        """Deletes this rank's claims of `keys` under `space` from the store
        once every rank is past them (after the round's second exchange)."""
        if not keys or not self.claiming:
            return
        try:
            for key in keys:
                self.st.store.delete_key(f"{space}/{key}")
        except Exception:  # noqa: BLE001 - the keys are unique to the round
            log.debug("compiler_collectives: shard_kernels: cannot delete claims", exc_info=True)

    def _build(self, kernels) -> tuple[list[Kernel], Optional[tuple[str, BaseException]]]:
        """Builds `kernels` (an iterable, drawn as a slot of Inductor's pool
        frees: ``compile_threads`` at once) on that pool; the kernels built
        and the first failure (no kernel is drawn after it; those running
        end first). A Triton kernel's future is set to the kernel Inductor
        loads, and the Triton cache entries the builds wrote are kept in
        ``self.triton_new`` (device index -> entry names) to be sent."""
        slots = _slots()
        built: list[Kernel] = []
        running: list[tuple[Kernel, Any]] = []
        before: dict[int, set[str]] = {}
        failure: Optional[tuple[str, BaseException]] = None
        todo = iter(kernels)
        while True:
            while failure is None and len(running) < slots:
                k = next(todo, None)
                if k is None:
                    break
                if k.device is not None and k.device not in before:
                    before[k.device] = _entries(k.device)
                hook = test_hooks.get("shard_build")
                try:
                    if hook is not None:
                        hook(k.key)  # stands for a build
                    running.append((k, _submit(k.task) if k.device is None else _triton(k.task)))
                except Exception as e:  # noqa: BLE001 - reported to every rank
                    failure = k.key, e
            if not running:
                break
            k, f = running.pop(_first_done([f for _, f in running]))
            try:
                result = _result(f)
            except Exception as e:  # noqa: BLE001 - reported to every rank
                failure = failure or (k.key, e)
                continue
            built.append(k)
            if k.device is not None and not k.future.done():
                k.future.set_result(result)
        for d, old in before.items():
            self.triton_new.setdefault(d, set()).update(_entries(d) - old)
        return built, failure

    def _transfer(self, held: list[Kernel], needs: dict[int, dict[str, list]],
                  source: dict[str, int], transfers: list[tuple[int, int, list[str]]]) -> None:
        me = self.st.channel.rank
        mine = {k.key: k for k in held}
        staged: Optional[tuple[str, list[dict], Optional[str]]] = None
        try:
            for s, r, keys in transfers:
                if not keys[0].startswith(TRITON_PREFIX):
                    self._transfer_cpp(s, r, keys, mine, needs)
                elif me == s:
                    if staged is None:
                        staged = _stage_triton(self.triton_new)
                    self._send(r, keys, staged[0], staged[1], staged[2])
                elif me == r:
                    device = next(k.device for k in held if k.key in keys)
                    self._receive_triton(s, keys, device)
        finally:
            if staged is not None:
                shutil.rmtree(staged[0], ignore_errors=True)
        here = [k for k in held if source.get(k.key) not in (None, me)
                and not k.key.startswith(TRITON_PREFIX) and source[k.key] in self.groups[me]]
        if here:
            count("loaded_shared", len(here), PREFIX)

    def _send(self, r: int, keys: list[str], root: str, files: list[dict],
              why: Optional[str]) -> None:
        """Sends `files` (under `root`) of `keys` to channel rank `r`: a D
        message (the manifest, or why there is none), then the chunks."""
        send(self.st, r, b"D", json.dumps({"files": files, "why": why}).encode(), SHARD_TAG)
        if files:
            send_files(self.st, r, root, files, SHARD_TAG)
            count("sent", len(keys), PREFIX)
            count("bytes_sent", sum(f["size"] for f in files), PREFIX)

    def _announced(self, s: int, keys: list[str], ok) -> dict:
        """The D message from channel rank `s` announcing the files of
        `keys`, checked (`ok`: whether a path is one this rank expects)."""
        kind, body = recv(self.st, s, SHARD_TAG)
        try:
            info = json.loads(body.decode()) if kind == b"D" else None
        except (ValueError, UnicodeDecodeError):
            info = None
        if not isinstance(info, dict) or not isinstance(info.get("files"), list) or not \
                all(isinstance(f, dict) and ok(f.get("path")) for f in info["files"]):
            raise violation(self.st, f"job rank {self._job(s)} sent a message of kind {kind!r} "
                                     f"this rank cannot read where the files of kernels {keys} "
                                     "were expected")
        return info

    def _receive_triton(self, s: int, keys: list[str], device: int) -> None:
        """Receives the Triton cache entries channel rank `s` built into
        this rank's Triton cache directory of `device` (each entry placed
        whole, its directory written into its JSON files, unless one of its
        name is there). A kernel it lacks is built by :meth:`_load_triton`."""
        info = self._announced(s, keys, lambda p: isinstance(p, str)
                               and _TRITON_FILE.match(p) is not None)
        where = _triton_dir(device)
        os.makedirs(where, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".ccol-", dir=where)
        try:
            ok = bool(info["files"]) and receive_files(
                self.st, s, info, "kernels " + ", ".join(keys), SHARD_TAG, PREFIX,
                root=staging, pattern=_TRITON_FILE)
            if ok:
                _place_triton(staging, where)
                self._count("received", len(keys))
            else:
                if not info["files"]:
                    log.info("compiler_collectives: shard_kernels: job rank %s sent no Triton "
                             "cache entry for kernels %s (%s): this rank builds them itself",
                             self._job(s), keys, info.get("why") or "its builds wrote none")
                self._count("fell_back", len(keys))
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _load_triton(self, held: list[Kernel]) -> None:
        """Loads the Triton kernels other ranks built (a hit in Triton's
        cache where their entries arrived; a build where they did not)."""
        futures = [(k, _triton(k.task)) for k in held]
        for k, f in futures:
            k.future.set_result(_result(f))

    def _transfer_cpp(self, s: int, r: int, keys: list[str], mine: dict[str, Kernel],
                      needs: dict[int, dict[str, list]]) -> None:
        """One C++ transfer: the outputs of `keys` from channel rank `s` to
        `r`; a receiver that rejects them builds the kernels itself."""
        me = self.st.channel.rank
        outputs = sorted({o for x in needs for k in keys if k in needs[x]
                          for o in needs[x][k][1]})
        if me == s:
            files, why = [], None
            try:
                for rel in outputs:
                    full = os.path.join(self.root, *rel.split("/"))
                    files.append({"path": rel, "size": os.path.getsize(full),
                                  "sha256": _digest(full)})
            except OSError as e:
                files, why = [], str(e)[:MAX_MESSAGE]
            self._send(r, keys, self.root, files, why)
        elif me == r:
            info = self._announced(s, keys, lambda p: p in outputs)
            ok = bool(info["files"]) and receive_files(
                self.st, s, info, "kernels " + ", ".join(keys), SHARD_TAG, PREFIX)
            if ok:
                self._count("received", len(keys))
                return
            if not info["files"]:
                log.warning("compiler_collectives: shard_kernels: job rank %s could not "
                            "send kernels %s (%s): this rank builds them itself",
                            self._job(s), keys, info.get("why"))
            self._count("fell_back", len(keys))
            _, failure = self._build([mine[k] for k in keys if k in mine])
            if failure is not None:
                raise failure[1]

    def finish(self, error: Optional[BaseException] = None) -> None:
        """The compile ended (with `error` when it raised): answers every
        exchange of the ranks still compiling with "done" until every rank
        is done, then resolves any build still held (Inductor builds it when
        it loads it). Raises :class:`PeerCompileFailed` where another rank's
        compile raised and this one did not."""
        text = ["done"] if error is None else [
            "done", "err", f"{type(error).__module__}.{type(error).__qualname__}",
            str(error)[:MAX_MESSAGE]]
        try:
            while True:
                rows = self._gather(text)
                if all(row[:1] == ["done"] for row in rows):
                    break
        except Error:
            if error is None:
                raise
            log.debug("compiler_collectives: shard_kernels: the end of a failed compile could "
                      "not reach the other ranks", exc_info=True)
        finally:
            for k in self.held:
                if not k.future.done():
                    k.future.set_result(None)
            self.held = []
        if error is None and self.peer_error is None and self.rounds:
            t = self.tally
            log.info("compiler_collectives: shard_kernels: key %s: %d kernel(s) built here, %d "
                     "received, %d built here after a transfer failed, in %d round(s) (%.2f s: "
                     "%.2f s building kernels, %.2f s in the rounds' exchanges, "
                     "waiting for the slowest rank)",
                     self.key, t["built"], t["received"], t["fell_back"], self.rounds,
                     t["seconds"], t["building"], t["waiting"])
        if error is None and self.peer_error is not None:
            r, kind, message = self.peer_error
            raise PeerCompileFailed(
                f"shard_kernels: job rank {self._job(r)}'s compile of AOTAutograd key "
                f"{self.key}, which every rank lowered, failed: {kind}: {message}",
                owner=self._job(r), compile_key=self.key, exc_type=kind, exc_message=message)


def _triton_dir(device: int) -> str:
    from torch._inductor.runtime.cache_dir_utils import triton_cache_dir

    return triton_cache_dir(device)


def _entries(device: int) -> set[str]:
    """The entries of this rank's Triton cache directory of `device`."""
    try:
        return {e for e in os.listdir(_triton_dir(device)) if _TRITON_ENTRY.match(e)}
    except OSError:
        return set()


def _stage_triton(new: dict[int, set[str]]) -> tuple[str, list[dict], Optional[str]]:
    """A temporary directory holding the Triton cache entries `new` (device
    index -> entry names) as they are sent: each JSON file's naming of its
    entry's directory replaced by :data:`DIR_MARK`; with their manifest
    (paths, sizes, digests), or why there is none."""
    root = tempfile.mkdtemp(prefix="ccol-triton-")
    files: list[dict] = []
    try:
        for device, names in sorted(new.items()):
            where = _triton_dir(device)
            for name in sorted(names):
                entry = os.path.join(where, name)
                os.makedirs(os.path.join(root, name), exist_ok=True)
                for f in sorted(os.listdir(entry)):
                    rel = f"{name}/{f}"
                    if not _TRITON_FILE.match(rel) or not os.path.isfile(os.path.join(entry, f)):
                        continue
                    with open(os.path.join(entry, f), "rb") as fh:
                        data = fh.read()
                    if f.endswith(".json"):
                        data = data.replace(entry.encode(), DIR_MARK)
                    with open(os.path.join(root, name, f), "wb") as fh:
                        fh.write(data)
                    files.append({"path": rel, "size": len(data),
                                  "sha256": hashlib.sha256(data).hexdigest()})
    except OSError as e:
        return root, [], str(e)[:MAX_MESSAGE]
    return root, files, None if files else "its builds wrote no Triton cache entry"


def _place_triton(staging: str, where: str) -> None:
    """Moves each received entry from `staging` into the Triton cache
    directory `where`, whole (a rename), its JSON files naming it; an entry
    already there is kept (its name is its content's key)."""
    for name in sorted(os.listdir(staging)):
        entry, target = os.path.join(staging, name), os.path.join(where, name)
        if not _TRITON_ENTRY.match(name) or not os.path.isdir(entry) or \
                os.path.isdir(target) and os.listdir(target):
            continue
        for f in os.listdir(entry):
            if f.endswith(".json"):
                path = os.path.join(entry, f)
                with open(path, "rb") as fh:
                    data = fh.read()
                with open(path, "wb") as fh:
                    fh.write(data.replace(DIR_MARK, target.encode()))
        try:
            os.rename(entry, target)
        except OSError:
            pass  # another process placed it first


def _slots() -> int:
    """How many builds Inductor's pool runs at once (``compile_threads``)."""
    from torch._inductor import config

    try:
        return max(1, int(config.compile_threads))
    except (TypeError, ValueError):
        return 1


def _first_done(futures: list) -> int:
    """The index of a build of `futures` that has ended: the first to end
    where all are the pool's futures, else the oldest (waited on)."""
    if all(isinstance(f, concurrent.futures.Future) for f in futures):
        done, _ = concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_COMPLETED)
        return next(i for i, f in enumerate(futures) if f in done)
    return 0


def _result(f: Any) -> Any:
    """What a build returned: a future's result, or the value itself (a
    Triton kernel compiled without the pool)."""
    from torch._inductor.codecache import CodeCacheFuture

    if isinstance(f, (concurrent.futures.Future, CodeCacheFuture)):
        return f.result()
    return f


_submit_original: Any = None
_triton_original: Any = None


def _triton(task: tuple) -> Any:
    """``AsyncCompile.triton`` as Inductor has it (or the test hook
    ``shard_triton``, which stands for it)."""
    return (test_hooks.get("shard_triton") or _triton_original)(*task)


def _submit(task: Any) -> Any:
    from torch._inductor.async_compile import AsyncCompile

    return _submit_original(AsyncCompile, task)


def run(sharding: Sharding, original, *args: Any, **kwargs: Any):
    """Runs `original` (AOTAutograd's stage 2) as this thread's sharded
    compile, then :meth:`Sharding.finish`."""
    _tls.sharding = sharding
    try:
        result = original(*args, **kwargs)
    except BaseException as e:
        _tls.sharding = None
        sharding.finish(e)
        raise
    _tls.sharding = None
    sharding.finish()
    return result


def install(st, patch) -> None:
    """Holds the kernel builds Inductor submits in a sharded compile (a C++
    kernel's at ``AsyncCompile.submit``, a Triton kernel's at
    ``AsyncCompile.triton`` unless the process holds it already) and takes
    a round at each ``AsyncCompile.wait``."""
    global _submit_original, _triton_original
    from torch._inductor.async_compile import AsyncCompile, CompiledTritonKernels

    submit = AsyncCompile.__dict__["submit"].__func__
    _submit_original = submit
    wait = AsyncCompile.__dict__["wait"]
    triton = AsyncCompile.__dict__["triton"]
    _triton_original = triton

    def holding_triton(self, kernel_name: str, source_code: str, device_str: str = "cuda"):
        sharding = active()
        if sharding is not None:
            caller = sys._getframe(1).f_code.co_name
            if caller == "<module>":
                # The graph's wrapper module, as it is imported.
                if CompiledTritonKernels.get(source_code) is None:
                    return sharding.hold_triton((self, kernel_name, source_code, device_str))
                sharding.note(triton_key(source_code))
                return _triton((self, kernel_name, source_code, device_str))
            if caller == PRESUBMIT:
                # Inductor's early submission while it writes the module (its
                # pool warm); the module's own call is held in its place.
                return None
            return _triton((self, kernel_name, source_code, device_str))
        return triton(self, kernel_name, source_code, device_str)

    def holding(cls, task: Any) -> Any:
        sharding = active()
        if sharding is not None:
            future = sharding.hold(task)
            if future is not None:
                return future
        return submit(cls, task)

    def waiting(self, scope: dict) -> Any:
        sharding = active()
        if sharding is not None:
            sharding.round()
        return wait(self, scope)

    holding.__wrapped__ = submit
    waiting.__wrapped__ = wait
    holding_triton.__wrapped__ = triton
    patch(st, AsyncCompile, "submit", classmethod(holding))
    patch(st, AsyncCompile, "wait", waiting)
    patch(st, AsyncCompile, "triton", holding_triton)
