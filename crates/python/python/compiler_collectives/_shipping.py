"""What a load needs and how it moves between ranks, for ``compile_once``
(``_compile_once``; docs/python.md, "Compile once"): the record of what a
lookup or a compile touched in Inductor's cache directory, the manifest of
the files a load needs (path, size, SHA-256), their checks, and their
transfer point to point on the channel, in chunks with an acknowledgement
every :data:`WINDOW` of them, into temporary files that are placed only
when every one passed."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import threading
from typing import Any, Optional

from ._errors import DecodeError, Error

log = logging.getLogger("compiler_collectives.compile_once")

#: The compile key of the lookup exchange, and of every compile-once
#: message (the key its errors name).
KEY = "torch.compile_once"
#: The point-to-point tag of every compile-once message.
TAG = 0x434F
#: The largest message: a file travels in chunks of at most this (bytes).
CHUNK_BYTES = 4 << 20
#: A sender waits for the receiver's acknowledgement after every this many
#: chunks: at most WINDOW * CHUNK_BYTES of one transfer are in flight.
WINDOW = 4
#: Dynamo's counters (``torch._dynamo.utils.counters``) under this name.
COUNTERS = "compiler_collectives"
#: The longest message text a peer's failure carries (characters).
MAX_MESSAGE = 2000

# A file a load needs, relative to Inductor's cache directory: an
# AOTAutograd entry, an FX graph entry, or a kernel's shared object (or an
# object file a kernel's shared object is linked from).
_SHIPPABLE = re.compile(
    r"^(aotautograd/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+"
    r"|fxgraph/[A-Za-z0-9_]{2}/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+"
    r"|[A-Za-z0-9_]{2}/[A-Za-z0-9_.-]+\.s?o)$"
)

_tls = threading.local()


def count(name: str, n: int = 1, prefix: str = "compile_once") -> None:
    from torch._dynamo.utils import counters

    counters[COUNTERS][f"{prefix}_{name}"] += n


def _cache_dir() -> str:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


class Record:
    """What one lookup or compile touched in the cache: the AOTAutograd key,
    the FX graph keys looked up or saved, the kernels' shared objects
    loaded, and whether the AOTAutograd entry was saved."""

    def __init__(self) -> None:
        self.key: Optional[str] = None
        self.fx_keys: list[str] = []
        self.libraries: list[str] = []
        self.saved = False


def _recording() -> list:
    stack = getattr(_tls, "records", None)
    if stack is None:
        stack = _tls.records = []
    return stack


def _note(what: str, value: Any) -> None:
    for rec in _recording():
        if what == "saved":
            rec.saved = True
        elif what == "key" and rec.key is None:
            rec.key = value
        elif what == "fx" and value not in rec.fx_keys:
            rec.fx_keys.append(value)
        elif what == "lib" and value not in rec.libraries:
            rec.libraries.append(value)


#: Every kernel shared object this process loaded, by kernel key (the
#: second argument of ``CppCodeCache._load_library``). A kernel a process
#: has loaded once is found in ``CppCodeCache.cache`` afterwards and never
#: loaded again, so a later graph that uses it is noted from here.
_LOADED: dict[str, str] = {}


def _note_loaded(path: str, key: Any) -> None:
    """``CppCodeCache._load_library(path, key)`` ran: remembered, and noted
    for the lookups and compiles being recorded."""
    if isinstance(key, str):
        _LOADED[key] = path
    if _recording():
        _note("lib", path)


def _key_of(cache: dict, fn: Any) -> str:
    """The kernel key of `fn`, an entry of ``cache`` (a ``CppCodeCache``
    class's in-memory kernels, by key), or ""."""
    for key, value in list(cache.items()):
        if value is fn:
            return key
    return ""


def _note_reused(cache: dict, fn: Any) -> None:
    """``CppCodeCache.load_async`` returned `fn`, the entry of ``cache``
    (the class's in-memory kernels): where this process loaded that kernel
    before, its shared object is noted for the records, since its loader
    is not called again."""
    if not _recording():
        return
    path = _LOADED.get(_key_of(cache, fn))
    if path is not None:
        _note("lib", path)


class _Recording:
    def __init__(self, rec: Record) -> None:
        self.rec = rec

    def __enter__(self) -> Record:
        _recording().append(self.rec)
        return self.rec

    def __exit__(self, *exc) -> None:
        _recording().remove(self.rec)


def files_of(rec: Record, root: str) -> list[str]:
    """The files (relative to `root`, the cache directory) a load of
    `rec`'s key needs: every AOTAutograd entry of the key, every entry of
    its FX graphs, and the kernels' shared objects it loaded (those under
    `root`)."""
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
    from torch._inductor.codecache import FxGraphCache

    out: list[str] = []
    dirs = [AOTAutogradCache._get_tmp_dir_for_key(rec.key)] if rec.key else []
    dirs += [FxGraphCache._get_tmp_dir_for_key(k) for k in rec.fx_keys]
    for d in dirs:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        out += [os.path.relpath(os.path.join(d, n), root) for n in names
                if not n.startswith(".") and os.path.isfile(os.path.join(d, n))]
    for path in rec.libraries:
        rel = os.path.relpath(os.path.realpath(path), os.path.realpath(root))
        if not rel.startswith(".."):
            out.append(rel)
    return [r for r in out if _SHIPPABLE.match(r.replace(os.sep, "/"))]


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def manifest(rec: Record, root: str) -> list[dict]:
    """``{"path", "size", "sha256"}`` of each file of :func:`files_of`."""
    out = []
    for rel in files_of(rec, root):
        full = os.path.join(root, rel)
        out.append({"path": rel.replace(os.sep, "/"), "size": os.path.getsize(full),
                    "sha256": _digest(full)})
    return out


class Rejected(Exception):
    """A received file failed its checks (path, size or digest)."""


def check_entry(entry: Any, limit: int, key: Optional[str] = None,
                pattern: re.Pattern = _SHIPPABLE) -> tuple[str, int, str]:
    """The path, size and digest of one manifest entry from a peer, checked:
    a relative path of the shapes a load needs (`pattern`; no ``..``, no
    absolute path), an AOTAutograd entry only under `key` (the key being
    shipped, where given), a size within `limit`, a 64-hex-digit digest.
    Raises :class:`Rejected`."""
    if not isinstance(entry, dict):
        raise Rejected(f"a manifest entry is a {type(entry).__name__}, not an object")
    path, size, digest = entry.get("path"), entry.get("size"), entry.get("sha256")
    if not isinstance(path, str) or not pattern.match(path) or ".." in path.split("/"):
        raise Rejected(f"the path {path!r} is not one of a cache entry or a kernel")
    if key is not None and path.startswith("aotautograd/") and path.split("/")[1] != key:
        raise Rejected(f"the AOTAutograd entry {path!r} is not of the key {key}")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= limit:
        raise Rejected(f"the size {size!r} of {path} is not within 0..{limit}")
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise Rejected(f"the digest {digest!r} of {path} is not a SHA-256")
    return path, size, digest


def _place(tmp: str, full: str) -> bool:
    """Moves the verified `tmp` to `full`, unless a file is there already
    (kept: a kernel in use must not change under its users, and the file's
    name is its content's key). A hard link makes the check and the move one
    step; a kernel's shared object is placed under Inductor's lock of that
    kernel too. Returns whether `full` was written."""

    def place() -> bool:
        try:
            os.link(tmp, full)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True

    if full.endswith(".so"):
        from torch._inductor.codecache import LOCK_TIMEOUT, get_lock_dir
        from torch.utils._filelock import FileLock

        name = os.path.basename(full).split(".", 1)[0]
        with FileLock(os.path.join(get_lock_dir(), name + ".lock"), timeout=LOCK_TIMEOUT):
            return place()
    return place()


def violation(st, message: str) -> DecodeError:
    """A peer broke the message order: the channel goes (the next messages
    could not be read in step), as for any peer's message that does not
    decode."""
    try:
        st.channel.abort()
    except Error:
        pass
    return DecodeError(f"compile_once: {message}; the channel is unusable: end the job")


#: Set by tests only (``tests/ranks/compile_once.py``): ``in_owner_compile``
#: (a callable the owner calls as its compile starts: it sleeps, raises or
#: kills the process), ``corrupt`` (the sender flips a byte of the first
#: chunk it sends), ``shard_build`` (a callable a rank calls with each
#: kernel key it builds in a sharded compile: it raises or kills),
#: ``shard_list_differs`` (True, or a round's number counted from 1 in a
#: sharded compile: this rank's kernel list reads as another graph's),
#: ``shard_triton`` (a callable that stands for ``AsyncCompile.triton``
#: where a round builds or loads a Triton kernel).
test_hooks: dict = {}


def send(st, peer: int, kind: bytes, body: bytes = b"", tag: int = TAG) -> None:
    """One compile-once message to the channel's rank `peer`: a kind byte
    (B beat, E error, D done, C chunk, X transfer ended, A acknowledgement,
    I installed, F failed to install), then its body."""
    st.channel.send_bytes(KEY, peer, tag, kind + body)


def recv(st, peer: int, tag: int = TAG) -> tuple[bytes, bytes]:
    """The next compile-once message from `peer` (kind, body), within the
    exchange deadline."""
    msg = st.channel.recv_bytes(KEY, peer, tag, CHUNK_BYTES + 1, st.channel.timeout_s)
    return msg[:1], msg[1:]


def send_files(st, peer: int, root: str, files: list[dict], tag: int = TAG) -> None:
    """Sends `files` (a manifest) to `peer` in chunks, waiting for its
    acknowledgement every WINDOW chunks; a file it cannot read ends the
    transfer with a message saying why (the receiver then compiles itself).
    A file of no bytes sends nothing."""
    first, sent = True, 0
    for f in files:
        left = f["size"]
        if left == 0:
            continue
        try:
            with open(os.path.join(root, *f["path"].split("/")), "rb") as fh:
                while left > 0:
                    chunk = fh.read(min(CHUNK_BYTES, left))
                    if not chunk:
                        raise OSError(f"{f['path']} is shorter than when it was announced")
                    left -= len(chunk)
                    if first and test_hooks.get("corrupt"):
                        chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
                    first = False
                    send(st, peer, b"C", chunk, tag)
                    sent += 1
                    if sent % WINDOW == 0:
                        expect_ack(st, peer, tag)
        except Error:
            raise  # the channel's (a Timeout is an OSError too)
        except OSError as e:
            send(st, peer, b"X", str(e).encode()[:MAX_MESSAGE], tag)
            return


def expect_ack(st, peer: int, tag: int = TAG) -> None:
    kind, _ = recv(st, peer, tag)
    if kind != b"A":
        raise violation(st, f"rank {peer} sent a message of kind {kind!r} where an "
                            "acknowledgement of the chunks it received was expected")


def receive_files(st, source: int, info: dict, key: str, tag: int = TAG,
                  prefix: str = "compile_once", root: Optional[str] = None,
                  pattern: re.Pattern = _SHIPPABLE) -> bool:
    """Receives the announced files of `key` from `source` into hidden
    temporary files beside their places (Inductor's lookups skip names that
    start with a dot), checks each one's size and digest, and places them
    only when every one passed; the temporary files are removed whatever
    happens. Reads every announced chunk whatever happens (the next message
    from `source` must be the next one it sent); beats from `source` (it
    beats the receivers still waiting for their turn) are skipped. Returns
    whether the files were installed. `root` (Inductor's cache directory
    where None) and `pattern` (the paths it accepts) serve other
    directories' files."""
    root = root or _cache_dir()
    limit = st.max_artifact_bytes
    try:
        files = info.get("files", [])
        if not isinstance(files, list):
            raise Rejected(f"the files are a {type(files).__name__}, not a list")
        entries = [check_entry(e, limit, key, pattern) for e in files]
    except Rejected as e:
        raise violation(st, f"rank {source} announced a file this rank refuses ({e})") from None
    temps: list[tuple[str, str]] = []
    why, chunks = None, 0
    total = sum(size for _, size, _ in entries)
    if total > limit:
        # Read (and drop) every chunk, writing nothing.
        why = f"{total} bytes announced, past max_artifact_bytes ({limit})"
    try:
        for path, size, digest in entries:
            full = os.path.join(root, *path.split("/"))
            h, got, out = hashlib.sha256(), 0, None
            if why is None:
                try:
                    os.makedirs(os.path.dirname(full), exist_ok=True)
                    tmp = os.path.join(os.path.dirname(full), f".ccol-{os.getpid()}-"
                                       f"{secrets.token_hex(6)}-{os.path.basename(full)}")
                    out = open(tmp, "wb")
                    temps.append((tmp, full))
                except OSError as e:
                    why = f"cannot write {path}: {e}"
            try:
                while got < size:
                    kind, chunk = recv(st, source, tag)
                    if kind == b"B":
                        continue
                    if kind == b"X":
                        why = f"rank {source} could not read {path}: " + chunk.decode(
                            errors="replace")
                        break
                    if kind != b"C" or got + len(chunk) > size:
                        raise violation(st, f"rank {source} sent a message of kind {kind!r} "
                                            f"({len(chunk)} bytes) in the middle of {path}")
                    got += len(chunk)
                    chunks += 1
                    if chunks % WINDOW == 0:
                        send(st, source, b"A", tag=tag)
                    h.update(chunk)
                    if out is not None:
                        try:
                            out.write(chunk)
                        except OSError as e:
                            why = why or f"cannot write {path}: {e}"
            finally:
                if out is not None:
                    out.close()
            if got < size:
                break  # the sender ended the transfer (X)
            if why is None and h.hexdigest() != digest:
                why = f"{path}: its SHA-256 is not the one rank {source} announced"
        if why is not None:
            log.warning("compiler_collectives: %s rejected the files of %s from "
                        "job rank %s (%s): this rank %s itself", prefix,
                        f"key {key}" if prefix == "compile_once" else key,
                        st.ranks[source] if st.ranks else source, why,
                        "compiles it" if prefix == "compile_once" else "builds them")
            count("rejected", prefix=prefix)
            return False
        # The AOTAutograd entry last: a lookup that finds it finds the rest.
        temps.sort(key=lambda t: os.path.relpath(t[1], root).startswith("aotautograd"))
        for tmp, full in temps:
            _place(tmp, full)
        count("bytes_received", total, prefix)
        return True
    finally:
        for tmp, _ in temps:
            try:
                os.unlink(tmp)
            except OSError:
                pass
