#!/usr/bin/env python3
"""Regenerates the "versions" part of compiler_collectives' torch table.

The table (crates/python/python/compiler_collectives/_torch_table.json)
lists what compiler_collectives.torch replaces, wraps or relies on in torch
("entries", written by hand) and each entry's value in every torch version
it was tested with ("versions", written by this script). The values are
computed by compiler_collectives/_compat.py, with `ast` only, never
importing torch: the same code enable() runs on the installed torch.

Usage:
  scripts/torch-table.py --source DIR [--version X]   # DIR holds torch/ (a wheel's
                                                      # unzipped sources) or is torch/
  scripts/torch-table.py --python PY                  # the torch installed for PY
                                                      # (this script runs under PY)
  scripts/torch-table.py                              # the torch of this Python
Options:
  --write        store the values as the table's entry for that version
  --table PATH   another table file (default: the package's)

Prints {"version": X, "values": {...}} (or, with --write, what changed).
Exits 1 when a required entry is absent, or a callable entry cannot be
called as the package calls it, in that version.

A new torch release: unzip its wheel's sources
(`pip download --no-deps torch==X`; `unzip W 'torch/*.py' 'torch/*.pyi'`),
run with --source ... --write, then run the package's tests on it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "..", "crates", "python", "python", "compiler_collectives")


def load_compat():
    spec = importlib.util.spec_from_file_location("_ccol_compat", os.path.join(PACKAGE, "_compat.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def installed_root() -> str:
    spec = importlib.util.find_spec("torch")  # does not run torch/__init__.py
    if spec is None or spec.origin is None:
        sys.exit(f"no torch installed for {sys.executable}")
    return os.path.dirname(os.path.dirname(spec.origin))


def check(compat, entries, values, version) -> list:
    """What makes `version` unusable: required entries absent, call shapes
    that do not bind."""
    bad = []
    for path, entry in entries.items():
        value = values[path]
        if value is None:
            if entry.get("required"):
                bad.append(f"{path}: required, absent in torch {version}")
            continue
        call = entry.get("call")
        if call is None:
            continue
        found = compat.find(ROOT, path)
        sigs = compat.signatures(found) if found is not None else None
        if sigs is None:
            continue
        nargs, kwargs = int(call.get("args", 0)), list(call.get("kwargs", []))
        if not any(compat.binds(s, nargs, kwargs) for s in sigs):
            bad.append(f"{path}: {compat._describe_call(nargs, kwargs)} does not bind to "
                       + " | ".join(compat.render(s) for s in sigs))
    return bad


def write_table(path: str, table: dict, compat) -> None:
    table["versions"] = {
        v: table["versions"][v]
        for v in sorted(table["versions"], key=lambda v: compat.release(v) or ())
    }
    text = json.dumps(table, indent=1, ensure_ascii=False) + "\n"
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def main() -> int:
    global ROOT
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--source", help="a directory holding torch/ (or torch/ itself)")
    p.add_argument("--version", help="the version of --source (default: its torch/version.py)")
    p.add_argument("--python", help="the Python whose installed torch to read (runs this script)")
    p.add_argument("--table", help="the table file (default: the package's)")
    p.add_argument("--write", action="store_true", help="store the values in the table")
    a = p.parse_args()
    if a.python:
        argv = [a.python, os.path.abspath(__file__)]
        for opt in ("table", "version"):
            if getattr(a, opt):
                argv += [f"--{opt}", getattr(a, opt)]
        if a.write:
            argv.append("--write")
        return subprocess.call(argv)
    compat = load_compat()
    if a.source:
        root = os.path.abspath(a.source)
        if os.path.basename(root) == "torch" and not os.path.isdir(os.path.join(root, "torch")):
            root = os.path.dirname(root)
    else:
        root = installed_root()
    if not os.path.isdir(os.path.join(root, "torch")):
        sys.exit(f"{root} holds no torch/")
    ROOT = root
    version = a.version or compat.source_version(root)
    if not version:
        sys.exit(f"{root}: no torch/version.py; pass --version")
    version = compat.plain(version)
    table_file = a.table or compat.table_path()
    table = compat.load_table(table_file)
    entries = table["entries"]
    values = compat.observe(root, entries)
    bad = check(compat, entries, values, version)
    if a.write:
        old = table["versions"].get(version)
        table["versions"][version] = values
        write_table(table_file, table, compat)
        if old is None:
            print(f"{table_file}: added torch {version}")
        else:
            changed = [k for k in entries if old.get(k) != values[k]]
            print(f"{table_file}: torch {version}: "
                  + (f"changed {', '.join(changed)}" if changed else "unchanged"))
    else:
        print(json.dumps({"version": version, "values": values}, indent=1))
    marked = any(e.get("restart_skip") for e in entries.values())
    gate = compat.restart_skip_gate(table, values) if marked else None
    if gate is not None:
        print(f"torch-table: torch {version}: Dynamo's restart is never skipped there ({gate}); "
              "read those sources against _restart.py's rule, then add the version to the "
              "table's restart_skip_read", file=sys.stderr)
    for line in bad:
        print(f"torch-table: {line}", file=sys.stderr)
    return 1 if bad else 0


ROOT = ""

if __name__ == "__main__":
    sys.exit(main())
