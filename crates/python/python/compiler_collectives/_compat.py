"""Which torch this is, read from its source: the version table's checks.

``_torch_table.json`` lists every torch function, class, field, call site
and setting ``compiler_collectives.torch`` replaces, wraps or relies on
(its "entries"), and what each looked like in every torch version the
package was tested with (its "versions"). This module computes the same
observation for an installed torch, with ``ast`` only, from the ``.py`` /
``.pyi`` files under a directory holding ``torch/``: ``scripts/torch-table.py``
runs the very same code over a wheel's unzipped sources, so a value in the
table and a value observed at run time are computed one way.

What is observed, per kind of entry:

- ``digest``: sha256 of the function's source lines, from its first
  decorator to its last line (``end_lineno``), dedented, joined by
  ``"\\n"`` with a final ``"\\n"``. Only functions and methods are digested;
  the value does not depend on the Python that parses the file.
- ``callable``: the parameter list, names and kinds only (``(a, b=, *,
  c=, **kwargs)``); for a class, its ``__init__``'s or its dataclass
  fields; for stubs with ``@overload``, every overload (`` | ``).
- ``exists``: ``true``: a module-level name, a class attribute, a
  dataclass field, or an attribute a method assigns on ``self``.

An absent entry is ``null``. At run time the live objects are checked as
well (``live_problems``): each must exist (``getattr``), be callable with
the call shape the package uses (``inspect.signature(...).bind``), and a
digested function must be the one in torch's file (not replaced at run
time).

This module imports neither torch nor the rest of the package, so that
the generator can load it from a checkout by its file path.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import textwrap
import warnings
from typing import Any, Dict, List, Optional, Tuple

#: The table shipped with the package; ``CCOL_TORCH_TABLE`` or this
#: attribute (tests set it) name another.
TABLE: Optional[str] = None
DEFAULT_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torch_table.json")

FORMAT = 1


def table_path() -> str:
    return TABLE or os.environ.get("CCOL_TORCH_TABLE") or DEFAULT_TABLE


def load_table(path: Optional[str] = None) -> dict:
    with open(path or table_path(), encoding="utf-8") as f:
        table = json.load(f)
    if table.get("format") != FORMAT:
        raise ValueError(f"{path or table_path()}: table format {table.get('format')!r}, "
                         f"this code reads {FORMAT}")
    return table


# --------------------------------------------------------------------------
# Versions
# --------------------------------------------------------------------------


def release(version: str) -> Optional[Tuple[int, ...]]:
    """(2, 15, 0) of "2.15.0+cu132" / "2.16.0.dev20261201"; None if none."""
    m = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", version)
    if not m:
        return None
    return tuple(int(g or 0) for g in m.groups())


def plain(version: str) -> str:
    """The version without its local part ("+cu132")."""
    return version.split("+", 1)[0].strip()


def nearest(version: str, known: List[str]) -> str:
    """The known version to compare with (and follow): the newest known for
    a newer torch, the oldest for an older one, else the newest known one not
    newer than it."""
    ordered = sorted(known, key=lambda v: release(v) or ())
    if plain(version) in ordered:
        return plain(version)
    r = release(version)
    if r is None or r >= release(ordered[-1]):
        return ordered[-1]
    if r <= release(ordered[0]):
        return ordered[0]
    return [v for v in ordered if release(v) <= r][-1]


# --------------------------------------------------------------------------
# Reading torch's source
# --------------------------------------------------------------------------

_PARSED: Dict[str, Tuple[Tuple[int, int], ast.Module, List[str]]] = {}


#: The files `_parse` was asked for since `observe` began (what its
#: observation depends on, with the entries and this module).
_READ: set = set()


def _parse(path: str) -> Optional[Tuple[ast.Module, List[str]]]:
    _READ.add(path)
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_mtime_ns, st.st_size)
    hit = _PARSED.get(path)
    if hit is not None and hit[0] == key:
        return hit[1], hit[2]
    with open(path, "rb") as f:
        data = f.read()
    text = data.decode("utf-8")
    tree = ast.parse(data, filename=path)
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    _PARSED[path] = (key, tree, lines)
    return tree, lines


def module_file(root: str, module: str) -> Optional[str]:
    """The file of `module` under `root` (a directory holding torch/): its
    .py, its package's __init__.py, else the stub (.pyi) of a C module."""
    base = os.path.join(root, *module.split("."))
    for candidate in (base + ".py", os.path.join(base, "__init__.py"), base + ".pyi",
                      os.path.join(base, "__init__.pyi")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _statements(body):
    """A body's statements, including those under if/try/with (TYPE_CHECKING
    branches, optional imports)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _statements(node.body)
            yield from _statements(node.orelse)
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            yield from _statements(node.body)
            for h in node.handlers:
                yield from _statements(h.body)
            yield from _statements(node.orelse)
            yield from _statements(node.finalbody)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            yield from _statements(node.body)


def _targets(node) -> List[str]:
    names = []
    if isinstance(node, ast.Assign):
        todo = list(node.targets)
        while todo:
            t = todo.pop()
            if isinstance(t, ast.Name):
                names.append(t.id)
            elif isinstance(t, (ast.Tuple, ast.List)):
                todo.extend(t.elts)
            elif isinstance(t, ast.Starred):
                todo.append(t.value)
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        names.append(node.target.id)
    return names


class Found:
    """What a dotted path names in the source."""

    def __init__(self, kind: str, file: str, lines: List[str], nodes=(), module: str = "",
                 scope=None) -> None:
        self.kind = kind  # "module", "function", "class", "value"
        self.file = file
        self.lines = lines
        self.nodes = list(nodes)  # every def of a function (overloads), or the class
        self.module = module
        self.scope = scope  # the ClassDef a function or value was found in


def _is_overload(fn) -> bool:
    return any(_dotted(d).rsplit(".", 1)[-1] == "overload" for d in fn.decorator_list)


def _dotted(node) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return _dotted(node.value) + "." + node.attr
    return ""


def _resolve_relative(module: str, is_package: bool, level: int, name: Optional[str]) -> str:
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([name] if name else []))


def find(root: str, path: str, _depth: int = 0) -> Optional[Found]:
    """What the dotted `path` names in the sources under `root`, or None."""
    if _depth > 8:
        return None
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        file = module_file(root, module)
        if file is not None:
            break
    else:
        return None
    parsed = _parse(file)
    if parsed is None:
        return None
    tree, lines = parsed
    rest = parts[i:]
    if not rest:
        return Found("module", file, lines, module=module)
    is_package = os.path.basename(file).startswith("__init__.")
    body, cls = tree.body, None
    for k, name in enumerate(rest):
        last = k == len(rest) - 1
        hit = _lookup(tree, body, cls, name)
        if hit is None:
            if cls is None and not last:
                # A submodule not imported by name (torch.a.b.c with b a package).
                return None
            return None
        what, node = hit
        if what == "import":
            target = node
            if isinstance(target, tuple):  # (level, module, name) of a from-import
                level, mod, attr = target
                base = _resolve_relative(module, is_package, level, mod) if level else mod
                target = f"{base}.{attr}"
            return find(root, ".".join([target] + rest[k + 1:]), _depth + 1)
        if last:
            if what == "function":
                return Found("function", file, lines, node, module, cls)
            if what == "class":
                return Found("class", file, lines, [node], module, cls)
            return Found("value", file, lines, (), module, cls)
        if what != "class":
            return None
        body, cls = node.body, node
    return None


def _lookup(tree, body, cls, name):
    """(kind, node) of `name` in a module or class body; the last binding wins."""
    found = None
    defs = []
    for node in _statements(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            defs.append(node)
            found = ("function", defs)
        elif isinstance(node, ast.ClassDef) and node.name == name:
            found, defs = ("class", node), []
        elif name in _targets(node):
            found, defs = ("value", node), []
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    found, defs = ("import", (node.level, node.module, alias.name)), []
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname == name:
                    found, defs = ("import", alias.name), []
    if found is not None:
        return found
    if cls is not None:
        # An attribute a method assigns on self, then the class's bases
        # defined in the same module.
        if name in _self_attributes(cls):
            return ("value", cls)
        for base in cls.bases:
            if isinstance(base, ast.Name):
                for node in _statements(tree.body):
                    if isinstance(node, ast.ClassDef) and node.name == base.id:
                        hit = _lookup(tree, node.body, node, name)
                        if hit is not None:
                            return hit
    return None


def _self_attributes(cls) -> set:
    """The names a class's methods assign on self (computed once per class)."""
    names = getattr(cls, "_ccol_self_attributes", None)
    if names is None:
        names = set()
        for fn in cls.body:
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, ast.Assign):
                        targets = node.targets
                    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                        targets = [node.target]
                    else:
                        continue
                    for t in targets:
                        if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                                and t.value.id == "self"):
                            names.add(t.attr)
        cls._ccol_self_attributes = names
    return names


def _stub(fn) -> bool:
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                       and isinstance(s.value.value, str))]
    return all(isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
               and s.value.value is Ellipsis for s in body)


# --------------------------------------------------------------------------
# Observed values
# --------------------------------------------------------------------------


def _implementation(found: Found):
    """The def that runs: the last one not marked @overload."""
    defs = [d for d in found.nodes if not _is_overload(d)]
    return (defs or found.nodes)[-1]


def source_lines(found: Found) -> Tuple[int, int]:
    """1-based first (first decorator) and last line of a function's def."""
    fn = _implementation(found)
    start = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
    return start, fn.end_lineno


def digest(found: Found) -> str:
    start, end = source_lines(found)
    text = textwrap.dedent("\n".join(found.lines[start - 1:end]) + "\n")
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# A parameter: (name, kind, has_default); kind one of
# "posonly", "pos", "varargs", "kwonly", "varkw".
Param = Tuple[str, str, bool]


def _params(args: ast.arguments, drop_first: bool = False) -> List[Param]:
    positional = [(a.arg, "posonly") for a in args.posonlyargs] + [(a.arg, "pos") for a in args.args]
    n_default = len(args.defaults)
    out: List[Param] = []
    for j, (name, kind) in enumerate(positional):
        out.append((name, kind, j >= len(positional) - n_default))
    if drop_first and out and out[0][1] in ("posonly", "pos"):
        out = out[1:]
    if args.vararg is not None:
        out.append((args.vararg.arg, "varargs", False))
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        out.append((a.arg, "kwonly", d is not None))
    if args.kwarg is not None:
        out.append((args.kwarg.arg, "varkw", False))
    return out


def render(params: List[Param]) -> str:
    parts: List[str] = []
    posonly_done = False
    star = any(k == "varargs" for _, k, _ in params)
    for j, (name, kind, default) in enumerate(params):
        if kind != "posonly" and not posonly_done and any(k == "posonly" for _, k, _ in params):
            parts.append("/")
            posonly_done = True
        if kind == "kwonly" and not star:
            parts.append("*")
            star = True
        prefix = {"varargs": "*", "varkw": "**"}.get(kind, "")
        parts.append(prefix + name + ("=" if default else ""))
    if not posonly_done and params and all(k == "posonly" for _, k, _ in params):
        parts.append("/")
    return "(" + ", ".join(parts) + ")"


def _decorators(fn) -> List[str]:
    return [_dotted(d).rsplit(".", 1)[-1] for d in fn.decorator_list]


def signatures(found: Found) -> Optional[List[List[Param]]]:
    """Each way the object can be called (one per overload), as the package
    calls it: a method through its class keeps self, a classmethod does not;
    a class by its __init__ (without self) or its dataclass fields."""
    if found.kind == "function":
        out = []
        overloads = [d for d in found.nodes if _is_overload(d)]
        for fn in overloads or [_implementation(found)]:
            decos = _decorators(fn)
            out.append(_params(fn.args, drop_first="classmethod" in decos))
        return out
    if found.kind == "class":
        cls = found.nodes[0]
        inits = [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name == "__init__"]
        if inits:
            chosen = [f for f in inits if _is_overload(f)] or [inits[-1]]
            return [_params(f.args, drop_first=True) for f in chosen]
        if any(d in ("dataclass",) for d in _decorators(cls)):
            fields: List[Param] = []
            kw_only = False
            for node in cls.body:
                if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                    continue
                ann = _dotted(node.annotation.value if isinstance(node.annotation, ast.Subscript)
                              else node.annotation)
                if ann.rsplit(".", 1)[-1] == "ClassVar":
                    continue
                if ann.rsplit(".", 1)[-1] == "KW_ONLY":
                    kw_only = True
                    continue
                default = node.value is not None
                if isinstance(node.value, ast.Call) and _dotted(node.value).rsplit(".", 1)[-1] == "field":
                    kws = {k.arg: k.value for k in node.value.keywords}
                    init = kws.get("init")
                    if isinstance(init, ast.Constant) and init.value is False:
                        continue
                    default = "default" in kws or "default_factory" in kws
                fields.append((node.target.id, "kwonly" if kw_only else "pos", default))
            return [fields]
        return None
    return None


def binds(params: List[Param], nargs: int, kwargs: List[str]) -> bool:
    """Whether a call with `nargs` positional and these keyword arguments
    binds to `params` (what inspect.Signature.bind decides)."""
    positional = [p for p in params if p[1] in ("posonly", "pos")]
    has_var = any(p[1] == "varargs" for p in params)
    has_varkw = any(p[1] == "varkw" for p in params)
    if nargs > len(positional) and not has_var:
        return False
    bound = {p[0] for p in positional[:nargs]}
    for k in kwargs:
        match = [p for p in params if p[0] == k and p[1] in ("pos", "kwonly")]
        if match:
            if k in bound:
                return False
            bound.add(k)
        elif not has_varkw:
            return False
    return all(p[0] in bound or p[2] for p in params if p[1] in ("posonly", "pos", "kwonly"))


def observe_one(root: str, path: str, entry: dict) -> Any:
    """The table's value of one entry for the sources under `root`."""
    found = find(root, path)
    if found is None:
        return None
    kind = entry["kind"]
    if kind == "exists":
        return True
    if kind == "digest":
        if found.kind != "function":
            return f"<a {found.kind}, not a function>"
        return digest(found)
    if kind == "callable":
        sigs = signatures(found)
        if sigs is None:
            return f"<a {found.kind} with no signature in its source>"
        return " | ".join(render(s) for s in sigs)
    raise ValueError(f"{path}: unknown kind {kind!r}")


def observe(root: str, entries: Dict[str, dict]) -> Dict[str, Any]:
    """Every entry's value for the sources under `root` (holding torch/)."""
    return {path: observe_one(root, path, entry) for path, entry in entries.items()}


def _file_digest(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def cache_dir() -> Optional[str]:
    """Where `observe_cached` keeps observations: ``$CCOL_CACHE``, else
    ``$XDG_CACHE_HOME/compiler-collectives``, else
    ``~/.cache/compiler-collectives`` (the project's cache, as every tool of
    it finds it), subdirectory ``torch-table``."""
    base = os.environ.get("CCOL_CACHE")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "compiler-collectives")
    return os.path.join(base, "torch-table")


def observe_cached(root: str, entries: Dict[str, dict]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """`observe`, kept on disk: parsing torch's sources costs about 2 s, and
    the observation depends only on the entries, this module and the bytes
    of the files it read. A record is used only when every one of those
    files still has the sha256 it had (about 10 ms to check); otherwise, or
    when the cache cannot be read or written, the sources are parsed.
    Returns the observation and `def_site` of each digested entry."""
    with open(__file__, "rb") as f:
        own = f.read()
    key = hashlib.sha256(
        json.dumps([FORMAT, os.path.realpath(root), entries], sort_keys=True).encode()
        + own
    ).hexdigest()
    directory = cache_dir()
    record = os.path.join(directory, key[:32] + ".json") if directory else None
    if record is not None:
        try:
            with open(record, encoding="utf-8") as f:
                kept = json.load(f)
            if kept["files"] and all(_file_digest(p) == d for p, d in kept["files"].items()):
                sites = {p: tuple(v) if v else None for p, v in kept["sites"].items()}
                return kept["observed"], sites
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    _READ.clear()
    observed = observe(root, entries)
    sites = {p: def_site(root, p) for p, e in entries.items() if e["kind"] == "digest"}
    if record is not None:
        try:
            files = {p: _file_digest(p) for p in sorted(_READ)}
            os.makedirs(directory, mode=0o700, exist_ok=True)
            tmp = f"{record}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"files": files, "observed": observed, "sites": sites}, f)
            os.replace(tmp, record)
        except OSError:
            pass
    return observed, sites


def source_version(root: str) -> Optional[str]:
    """torch/version.py's __version__, read without importing torch."""
    parsed = _parse(os.path.join(root, "torch", "version.py"))
    if parsed is None:
        return None
    for node in _statements(parsed[0].body):
        if "__version__" in _targets(node) and isinstance(node.value, ast.Constant):
            return str(node.value.value)
    return None


# --------------------------------------------------------------------------
# The live objects
# --------------------------------------------------------------------------


def _import_prefix(path: str):
    import importlib

    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            return importlib.import_module(".".join(parts[:i])), parts[i:]
        except ImportError:
            continue
    raise ImportError(path)


def resolve(path: str):
    """The live object `path` names (imports its module)."""
    obj, rest = _import_prefix(path)
    for attr in rest:
        obj = getattr(obj, attr)
    return obj


def _call_shape(entry: dict) -> Optional[Tuple[int, List[str]]]:
    call = entry.get("call")
    if call is None:
        return None
    return int(call.get("args", 0)), list(call.get("kwargs", []))


def _describe_call(nargs: int, kwargs: List[str]) -> str:
    return "(" + ", ".join(["_"] * nargs + [f"{k}=_" for k in kwargs]) + ")"


def def_site(root: str, path: str) -> Optional[Tuple[str, int, bool]]:
    """Where the function `path` is defined: its file, its first line (as
    `source_lines`) and whether it has decorators; None if it is not a
    function."""
    found = find(root, path)
    if found is None or found.kind != "function":
        return None
    return found.file, source_lines(found)[0], bool(_implementation(found).decorator_list)


def live_problem(root: str, path: str, entry: dict, known: bool = False,
                 site: Optional[Tuple[str, int, bool]] = None) -> Optional[str]:
    """Why the live object of `path` fails its existence, callability or
    identity check, or None. Imports torch's modules. `known`: the sources
    say `path` exists (its observation is true), so an instance attribute of
    a live class needs no second look at the source. `site`: `def_site` of
    a digested function, when known already."""
    import dataclasses
    import inspect

    try:
        parent_path, name = path.rsplit(".", 1)
        parent, rest = _import_prefix(path)
        if not rest:
            obj = parent
        else:
            parent = resolve(parent_path)
            with warnings.catch_warnings():
                # A deprecated alias (torch.distributed.config.compile_on_one_rank
                # from 2.14) warns when read.
                warnings.simplefilter("ignore")
                obj = getattr(parent, name)
    except (ImportError, AttributeError) as e:
        # An instance attribute: a dataclass field, or one the class's
        # methods assign on self (read from the source of each class of its
        # MRO).
        try:
            parent = resolve(path.rsplit(".", 1)[0])
        except (ImportError, AttributeError):
            return f"absent at run time: {e}"
        if isinstance(parent, type):
            if known:
                return None
            if dataclasses.is_dataclass(parent) and name in {f.name for f in dataclasses.fields(parent)}:
                return None
            for klass in parent.__mro__:
                qual = f"{klass.__module__}.{klass.__qualname__}.{name}"
                found = find(root, qual)
                if found is not None and found.kind == "value":
                    return None
        return f"absent at run time: {e}"
    kind = entry["kind"]
    shape = _call_shape(entry)
    if kind in ("digest", "callable") or shape is not None:
        if not callable(obj):
            return f"not callable (a {type(obj).__name__})"
    if shape is not None:
        nargs, kwargs = shape
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):
            sig = None
        if sig is not None:
            try:
                sig.bind(*([None] * nargs), **{k: None for k in kwargs})
            except TypeError as e:
                return f"cannot be called as {_describe_call(nargs, kwargs)}: {sig} ({e})"
        else:
            # A C function: its stub's signature.
            found = find(root, path)
            sigs = signatures(found) if found is not None else None
            if sigs is not None and not any(binds(s, nargs, kwargs) for s in sigs):
                return (f"cannot be called as {_describe_call(nargs, kwargs)}: "
                        f"{' | '.join(render(s) for s in sigs)}")
    if kind == "digest":
        at = def_site(root, path) if site is None else site
        if at is not None:
            file, start, decorated = at
            candidates = [obj]
            if decorated:
                candidates.append(inspect.unwrap(obj))
            for c in candidates:
                code = getattr(c, "__code__", None)
                if (code is not None and code.co_firstlineno == start
                        and os.path.realpath(code.co_filename) == os.path.realpath(file)):
                    return None
            code = getattr(inspect.unwrap(obj), "__code__", None)
            where = f"{code.co_filename}:{code.co_firstlineno}" if code else repr(obj)
            return (f"replaced at run time: the live object is "
                    f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', '?')} "
                    f"({where}), not torch's source")
    return None


# --------------------------------------------------------------------------
# The decision
# --------------------------------------------------------------------------


def restart_skip_gate(table: dict, seen: Dict[str, Any]) -> Optional[str]:
    """None where the skip of Dynamo's restart (``_restart``) may run on the
    torch whose entries read ``seen``: every entry marked ``restart_skip``
    reads as in one version of the table's ``restart_skip_read`` (the
    versions whose sources of those entries were read for the skip's rule).
    Otherwise why not, in words: the restart then always runs."""
    marked = [p for p, e in table["entries"].items() if e.get("restart_skip")]
    versions = table["versions"]
    read = [v for v in table.get("restart_skip_read", []) if v in versions]
    for v in read:
        if all(seen.get(p) == versions[v].get(p) for p in marked):
            return None
    if not read:
        return "no torch version's sources were read for the skip of the restart"
    nearest_read = max(read, key=lambda v: sum(seen.get(p) == versions[v].get(p) for p in marked))
    differ = [p for p in marked if seen.get(p) != versions[nearest_read].get(p)]
    return (f"this torch's {', '.join(differ)} differ from torch {nearest_read}'s, and from "
            "every version read for the skip of the restart")
