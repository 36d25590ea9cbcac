"""Which torch enable() runs on: the version table (_torch_table.json), its
generator (scripts/torch-table.py), an untested torch, the opt-in, and the
settings enable() refuses."""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

import compiler_collectives
import compiler_collectives.torch as cct
from compiler_collectives import _checks, _compat, _decide

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
GENERATOR = os.path.join(REPO, "scripts", "torch-table.py")
INSTALLED = _compat.plain(torch.__version__)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))
TABLE = _compat.load_table()
LOGGER = "compiler_collectives.torch"

from conftest import count_compiles, replaced_objects  # world_of_one is conftest's fixture too


def table_with(tmp_path, monkeypatch, keep=lambda v: True, entries=None):
    """Makes enable() read a copy of the table holding only the versions
    `keep` accepts (and `entries` added to every version)."""
    t = copy.deepcopy(TABLE)
    t["versions"] = {v: values for v, values in t["versions"].items() if keep(v)}
    for path, (entry, value) in (entries or {}).items():
        t["entries"][path] = entry
        for values in t["versions"].values():
            values[path] = value
    path = tmp_path / "table.json"
    path.write_text(json.dumps(t))
    monkeypatch.setattr(_compat, "TABLE", str(path))
    return t


def same_as_installed(v: str) -> bool:
    """Whether tested version `v` looks exactly like the installed torch to
    the table (2.14.0 does to 2.14.1): a table that must not know the
    installed torch leaves out every such version."""
    return TABLE["versions"].get(v) == TABLE["versions"][INSTALLED]


def differing(versions: dict, a: str, b: str) -> list:
    return [p for p in TABLE["entries"] if versions[a][p] != versions[b][p]]


# --------------------------------------------------------------------------
# The table and the installed torch
# --------------------------------------------------------------------------


def test_the_table_matches_the_installed_torch():
    assert INSTALLED in TABLE["versions"], f"torch {INSTALLED} is not in the table"
    observed = _compat.observe(ROOT, TABLE["entries"])
    assert observed == TABLE["versions"][INSTALLED]
    decision = _checks.check_torch()
    assert (decision.version, decision.matched, decision.differs, decision.warning) == (
        INSTALLED, True, [], None)
    # Every live object passes its existence, callability and identity check.
    problems = {p: _compat.live_problem(ROOT, p, e) for p, e in TABLE["entries"].items()
                if observed[p] is not None}
    assert {p: w for p, w in problems.items() if w is not None} == {}
    # The digest is the one the package used before the table:
    # sha256(dedent(inspect.getsource(f))) for an undecorated function.
    import torch._dynamo.distributed as dd
    import torch._dynamo.pgo as pgo

    for path, f in [("torch._dynamo.distributed.get_compile_pg", dd.get_compile_pg),
                    ("torch._dynamo.pgo.process_automatic_dynamic", pgo.process_automatic_dynamic)]:
        src = textwrap.dedent(inspect.getsource(f))
        assert observed[path] == hashlib.sha256(src.encode()).hexdigest()


def test_the_table_covers_the_supported_versions_and_marks_required_entries():
    versions = TABLE["versions"]
    assert {"2.11.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1", "2.15.0"} <= set(versions)
    assert cct.TORCH_VERSIONS == tuple(sorted(versions, key=_compat.release))
    assert cct.TORCH_VERSION == "2.15.0"
    # 2.14.0 and 2.14.1 are byte-identical where the package looks.
    assert versions["2.14.0"] == versions["2.14.1"]
    for path, entry in TABLE["entries"].items():
        assert entry["kind"] in ("digest", "callable", "exists"), path
        present = [v for v in versions if versions[v][path] is not None]
        if entry["required"]:
            assert present == list(versions), f"{path} is required but absent in some versions"
    # Every place _CONFIG reads a setting from is an entry of the table.
    for places in _checks.CONFIG:
        for path in places:
            assert path in TABLE["entries"], path
    # compile_on_one_rank moved: distributed.config up to 2.13, compiler.config from 2.14.
    moved = "torch.compiler.config.compile_on_one_rank"
    assert [v for v in versions if versions[v][moved]] == ["2.14.0", "2.14.1", "2.15.0"]
    assert all(versions[v]["torch.distributed.config.compile_on_one_rank"] for v in versions)
    # What the issue found from the wheels: get_compile_pg changes in 2.14 and
    # 2.15, CatchErrorsWrapper.__call__ in 2.14, get_compile_sync_pg is new in 2.15.
    replaced = ["torch._dynamo.output_graph.OutputGraph.run_compiler_collective",
                "torch._dynamo.distributed.get_compile_pg",
                "torch._dynamo.convert_frame.CatchErrorsWrapper.__call__",
                "torch._dynamo.eval_frame.guard_collectives_hook",
                "torch._dynamo.pgo.process_automatic_dynamic"]
    changed = lambda a, b: [p for p in replaced if versions[a][p] != versions[b][p]]  # noqa: E731
    assert changed("2.13.0", "2.14.1") == ["torch._dynamo.distributed.get_compile_pg",
                                            "torch._dynamo.convert_frame.CatchErrorsWrapper.__call__"]
    assert changed("2.14.1", "2.15.0") == ["torch._dynamo.distributed.get_compile_pg"]
    sync = "torch._dynamo.distributed.get_compile_sync_pg"
    assert [v for v in versions if versions[v][sync]] == ["2.15.0"]


def test_a_torch_matching_a_known_version_passes_whatever_its_version_string():
    versions = TABLE["versions"]
    for claimed in ("2.14.0", "2.14.1", "2.14.7+cu999", "3.0.0"):
        d = _decide.decide(TABLE, versions["2.14.1"], {}, claimed, False)
        assert d.matched and d.warning is None
        assert d.version == (_compat.plain(claimed) if claimed.startswith("2.14.") and
                             _compat.plain(claimed) in versions else "2.14.1")


def test_the_nearest_known_version_goes_by_version_order():
    known = ["2.11.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1", "2.15.0"]
    assert _compat.nearest("2.16.0.dev20261201+cpu", known) == "2.15.0"
    assert _compat.nearest("2.10.0", known) == "2.11.0"
    assert _compat.nearest("2.14.2", known) == "2.14.1"
    assert _compat.nearest("2.12.0", known) == "2.11.0"
    assert _compat.nearest("2.13.0+cu130", known) == "2.13.0"
    assert _compat.nearest("nonsense", known) == "2.15.0"


# --------------------------------------------------------------------------
# An untested torch
# --------------------------------------------------------------------------


def test_an_untested_torch_is_refused_naming_version_and_what_differs(
        world_of_one, tmp_path, monkeypatch):
    """The table without the installed version (for torch 2.15.0: the table
    with its entry removed)."""
    t = table_with(tmp_path, monkeypatch, keep=lambda v: not same_as_installed(v))
    follow = _compat.nearest(torch.__version__, list(t["versions"]))
    expected = differing(TABLE["versions"], INSTALLED, follow)
    assert expected, "the nearest version differs from the installed one in nothing"
    before = replaced_objects()
    with pytest.raises(compiler_collectives.IncompatibleTorch) as e:
        cct.enable(timeout=20)
    message = str(e.value)
    print(f"\nREFUSAL: {message}")
    assert message.startswith(
        f"compiler_collectives.torch was not tested with torch {torch.__version__}: it matches "
        f"none of the torch versions in its table ("
    )
    assert f"Compared with torch {follow}, the nearest: " in message
    named = [p for p in TABLE["entries"] if f"{p} (" in message]
    assert named == expected
    assert "Nothing was changed" in message and "allow_untested_torch=True" in message
    assert e.value.kind == "unsupported"
    assert replaced_objects() == before
    assert not cct.is_enabled()


@pytest.mark.parametrize("side", ["newer", "older"])
def test_the_nearest_is_the_newest_known_for_a_newer_torch_the_oldest_for_an_older(
        world_of_one, tmp_path, monkeypatch, side):
    r = _compat.release(INSTALLED)
    keep = (lambda v: _compat.release(v) < r and not same_as_installed(v)) if side == "newer" \
        else (lambda v: _compat.release(v) > r and not same_as_installed(v))
    versions = copy.deepcopy(TABLE["versions"])
    if not any(keep(v) for v in versions):
        # The installed torch is the newest (or oldest) tested one: two
        # made-up releases beyond it, each with one digest of its own.
        digests = [p for p, e in TABLE["entries"].items() if e["kind"] == "digest"]
        base = r[0], r[1] + 10 if side == "older" else r[1] - 10
        for i, p in enumerate(digests[:2]):
            v = f"{base[0]}.{base[1] + i if side == 'older' else base[1] - i}.0"
            versions[v] = dict(versions[INSTALLED], **{p: "0" * 64})
    kept = {v: values for v, values in versions.items() if keep(v)}
    t = table_with(tmp_path, monkeypatch, keep=lambda v: False)
    t["versions"] = kept
    (tmp_path / "table.json").write_text(json.dumps(t))
    assert kept
    ordered = sorted(kept, key=_compat.release)
    follow = ordered[-1] if side == "newer" else ordered[0]
    with pytest.raises(compiler_collectives.IncompatibleTorch) as e:
        cct.enable(timeout=20)
    assert f"Compared with torch {follow}, the nearest: " in str(e.value)
    named = [p for p in TABLE["entries"] if f"{p} (" in str(e.value)]
    assert named == differing(versions, INSTALLED, follow)


def test_with_the_opt_in_one_warning_and_a_working_compile(
        world_of_one, tmp_path, monkeypatch, caplog):
    t = table_with(tmp_path, monkeypatch, keep=lambda v: not same_as_installed(v))
    follow = _compat.nearest(torch.__version__, list(t["versions"]))
    torch._dynamo.reset()
    caplog.set_level(logging.WARNING)
    cct.enable(timeout=20, allow_untested_torch=True, exchange="always")
    try:
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert [r.name for r in warnings] == [LOGGER]
        text = warnings[0].getMessage()
        print(f"\nWARNING: {text}")
        assert text.startswith(
            f"compiler_collectives.torch: torch {torch.__version__} is untested "
            f"(allow_untested_torch=True); following torch {follow}, from which it differs in: "
        )
        named = [p for p in TABLE["entries"] if f"{p} (" in text]
        assert named == differing(TABLE["versions"], INSTALLED, follow)
        # The must-agree check carries the opt-in and the version followed.
        agreed = _checks.must_agree(False, True, follow)
        assert "allow_untested_torch=True" in agreed.splitlines()
        assert f"torch_followed={follow}" in agreed.splitlines()
        assert count_compiles((3, 3, 5, 7)) == [1, 2]
        assert cct.channel_info()["next_exchange"] == 3
    finally:
        cct.disable()


def test_with_the_opt_in_a_missing_required_entry_is_refused_naming_it(
        world_of_one, tmp_path, monkeypatch):
    import torch._dynamo.pgo as pgo
    import torch._dynamo.utils as utils

    absent = "torch._dynamo.symbolic_convert.LocalState.no_such_field"
    table_with(tmp_path, monkeypatch, keep=lambda v: not same_as_installed(v), entries={
        absent: ({"kind": "exists", "required": True, "why": "a test"}, True),
    })
    monkeypatch.delattr(pgo, "InferStride")
    monkeypatch.setattr(utils, "dynamo_timed", lambda key: None)
    before = replaced_objects()
    with pytest.raises(compiler_collectives.IncompatibleTorch) as e:
        cct.enable(timeout=20, allow_untested_torch=True)
    message = str(e.value)
    print(f"\nREFUSAL (required): {message}")
    assert message.startswith(
        f"compiler_collectives.torch cannot run on torch {torch.__version__}, even with "
        "allow_untested_torch=True: what it requires is missing or cannot be called as it "
        "calls it: "
    )
    assert f"{absent} (absent)" in message
    assert "torch._dynamo.pgo.InferStride (absent at run time: module 'torch._dynamo.pgo' " \
           "has no attribute 'InferStride')" in message
    assert "torch._dynamo.utils.dynamo_timed (cannot be called as " \
           "(_, log_pt2_compile_event=_): (key)" in message
    # Nothing else is named: the other required entries pass.
    named = [p for p in list(TABLE["entries"]) + [absent] if f"{p} (" in message]
    assert named == ["torch._dynamo.pgo.InferStride", "torch._dynamo.pgo.InferStride.dim",
                     "torch._dynamo.utils.dynamo_timed", absent]
    assert replaced_objects() == before
    assert not cct.is_enabled()


def test_a_known_torch_with_a_required_entry_gone_is_refused(world_of_one, monkeypatch):
    import torch._dynamo.symbolic_convert as sc

    monkeypatch.delattr(sc, "LocalState")
    with pytest.raises(compiler_collectives.IncompatibleTorch) as e:
        cct.enable(timeout=20)
    assert f"Compared with torch {INSTALLED}, the nearest: " in str(e.value)
    assert ("torch._dynamo.symbolic_convert.LocalState (absent at run time: module "
            "'torch._dynamo.symbolic_convert' has no attribute 'LocalState')") in str(e.value)
    named = [p for p in TABLE["entries"] if f"{p} (" in str(e.value)]
    assert named == ["torch._dynamo.symbolic_convert.LocalState",
                     "torch._dynamo.symbolic_convert.LocalState.automatic_dynamic",
                     "torch._dynamo.symbolic_convert.LocalState.render"]
    assert not cct.is_enabled()


def test_allow_untested_torch_must_be_a_bool(world_of_one):
    with pytest.raises(compiler_collectives.InvalidArgument, match="allow_untested_torch"):
        cct.enable(timeout=20, allow_untested_torch="yes")
    assert not cct.is_enabled()


# --------------------------------------------------------------------------
# Settings: where each version keeps them, and the refused functorch syncs
# --------------------------------------------------------------------------


def test_settings_are_read_where_the_version_keeps_them(world_of_one):
    settings = dict(_checks.settings(INSTALLED))
    versions = TABLE["versions"]
    place = ("torch.compiler.config.compile_on_one_rank"
             if versions[INSTALLED]["torch.compiler.config.compile_on_one_rank"]
             else "torch.distributed.config.compile_on_one_rank")
    assert settings[place] == "False"
    other = ({"torch.compiler.config.compile_on_one_rank",
              "torch.distributed.config.compile_on_one_rank"} - {place}).pop()
    assert other not in settings
    # Followed as 2.13 (distributed.config) and as 2.15 (compiler.config).
    assert "torch.distributed.config.compile_on_one_rank" in dict(_checks.settings("2.13.0"))
    assert "torch.compiler.config.compile_on_one_rank" in dict(_checks.settings("2.15.0"))
    agreed = _checks.must_agree(True, False, INSTALLED).splitlines()
    assert agreed[:9] == [f"torch={torch.__version__}", f"torch_followed={INSTALLED}",
                          f"compiler_collectives={compiler_collectives.__version__}",
                          f"wire={compiler_collectives.WIRE_VERSION}", "exchange=auto",
                          "guard_votes=True",
                          "allow_untested_torch=False", "cache_agreement=False",
                          "check_graphs=False"]
    # The caches' settings are compared too (the cache vote's preconditions).
    for path in ("torch._functorch.config.enable_autograd_cache",
                 "torch._inductor.config.fx_graph_cache",
                 "torch.compiler.config.force_disable_caches",
                 "torch.compiler.config.cache_key_tag"):
        assert [x for x in agreed if x.startswith(path + "=")] == [
            f"{path}={dict(_checks.settings(INSTALLED))[path]}"]
    for name in ("dynamic_sources", "unbacked_sources", "dynamic_values", "static_sources"):
        path = f"torch.compiler.config.{name}"
        line = [x for x in agreed if x.startswith(path + "=")]
        if versions[INSTALLED][path]:
            assert line == [f"{path}={getattr(torch.compiler.config, name)!r}"]
        else:
            assert line == [f"{path}=<absent in torch {INSTALLED}>"]
    for path in ("torch._dynamo.config.automatic_dynamic_exclusion_guard",
                 "torch._dynamo.config.canonicalize_output_graph_node_order",
                 "torch._functorch.config._sync_decision_cross_ranks",
                 "torch._functorch.config._sync_cache_decision_cross_ranks"):
        assert [x for x in agreed if x.startswith(path + "=")] == (
            [f"{path}=False"] if versions[INSTALLED][path]
            else [f"{path}=<absent in torch {INSTALLED}>"])


@pytest.mark.parametrize("flag", ["_sync_decision_cross_ranks",
                                  "_sync_cache_decision_cross_ranks"])
def test_a_functorch_cross_rank_sync_flag_is_served_by_the_channel(world_of_one, flag):
    """functorch's sync flags, refused up to issue 31, are now served: with
    either on, enable() succeeds and torch's functions that would run
    collectives on a torch group are the package's while enabled."""
    import torch._functorch._aot_autograd.autograd_cache as autograd_cache
    import torch._functorch.config as fc
    import torch._functorch.partitioners as partitioners

    if not TABLE["versions"][INSTALLED][f"torch._functorch.config.{flag}"]:
        # This torch has no such sync (it came in 2.15): no such setting.
        assert not hasattr(fc, flag)
        return
    original = partitioners._sync_decision_cross_ranks
    with fc.patch(flag, True):
        cct.enable(timeout=20)
        try:
            assert partitioners._sync_decision_cross_ranks.__wrapped__ is original
            if hasattr(autograd_cache, "sync_cache_decision_cross_ranks"):
                # A group of one: every rank's hit is its own.
                assert autograd_cache.sync_cache_decision_cross_ranks(True) is True
                assert autograd_cache.sync_cache_decision_cross_ranks.__wrapped__
        finally:
            cct.disable()
    assert partitioners._sync_decision_cross_ranks is original


def test_no_torch_process_group_is_created_by_a_compile(world_of_one):
    """With functorch's sync flags off (the default): a compile through
    AOTAutograd's partitioner creates no process group (neither Dynamo's
    pt2_compile_pg nor 2.15's pt2_compile_sync_pg)."""
    import torch._dynamo.distributed as dd
    import torch._functorch.config as fc

    c10d = dist.distributed_c10d
    assert not getattr(fc, "_sync_decision_cross_ranks", False)
    assert not getattr(fc, "_sync_cache_decision_cross_ranks", False)
    groups = set(c10d._world.pg_map)
    torch._dynamo.reset()
    cct.enable(timeout=20)
    try:
        @torch.compile(backend="aot_eager")
        def f(x):
            return (x.sin() * 2).sum()

        for n in (3, 5):
            x = torch.ones(n, requires_grad=True)
            f(x).backward()
            assert torch.allclose(x.grad, 2 * torch.ones(n).cos())
    finally:
        cct.disable()
    assert set(c10d._world.pg_map) == groups
    tags = [t for t in c10d._world.tags_to_pg if t.startswith("pt2_")]
    assert tags == []
    assert dd._COMPILE_PG is None
    assert getattr(dd, "_COMPILE_SYNC_PG", None) is None


# --------------------------------------------------------------------------
# The generator
# --------------------------------------------------------------------------


def run_generator(*args, table=None):
    """scripts/torch-table.py in a Python where importing torch fails."""
    argv = [GENERATOR, *args] + (["--table", str(table)] if table else [])
    code = ("import runpy, sys; sys.modules['torch'] = None; "
            f"sys.argv = {argv!r}; runpy.run_path({GENERATOR!r}, run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_the_generator_over_the_installed_sources_gives_the_committed_entry(tmp_path):
    """Only the files the table reads, copied from the installed torch."""
    _compat._PARSED.clear()
    _compat.observe(ROOT, TABLE["entries"])
    files = sorted(_compat._PARSED) + [os.path.join(ROOT, "torch", "version.py")]
    for f in files:
        rel = os.path.relpath(f, ROOT)
        assert rel.startswith("torch" + os.sep), f
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, tmp_path / "src" / rel)
    out = run_generator("--source", str(tmp_path / "src"))
    assert out.returncode == 0, out.stderr
    generated = json.loads(out.stdout)
    assert generated == {"version": INSTALLED, "values": TABLE["versions"][INSTALLED]}


FAKE = {
    "torch/version.py": "__version__ = '9.1.0+cpu'\n",
    "torch/_dynamo/__init__.py": "",
    "torch/_dynamo/distributed.py": '''\
from .helpers import helper as get_helper

def get_compile_pg():
    # a comment
    return None


class DistributedState:
    def __init__(self, compile_pg, local_state=None):
        self.compile_pg = compile_pg
''',
    "torch/_dynamo/helpers.py": '''\
import functools

@functools.lru_cache(None)
@staticmethod
def helper(a, /, b, *args, c=1, **kw):
    pass
''',
    "torch/_C/__init__.pyi": "",
    "torch/_C/_stub.pyi": '''\
from typing import overload
class Store:
    @overload
    def wait(self, keys: list[str]) -> None: ...
    @overload
    def wait(self, keys: list[str], timeout: int) -> None: ...
''',
}


def test_the_generator_reads_a_source_tree(tmp_path):
    for rel, text in FAKE.items():
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / rel).write_text(text)
    entries = {
        "torch._dynamo.distributed.get_compile_pg": {"kind": "digest", "required": True},
        "torch._dynamo.distributed.get_helper": {"kind": "callable", "required": True,
                                                 "call": {"args": 2, "kwargs": ["c"]}},
        "torch._dynamo.distributed.DistributedState": {"kind": "callable", "required": True,
                                                       "call": {"args": 1}},
        "torch._dynamo.distributed.DistributedState.compile_pg": {"kind": "exists",
                                                                  "required": True},
        "torch._C._stub.Store.wait": {"kind": "callable", "required": True,
                                      "call": {"args": 3}},
        "torch._dynamo.distributed.gone": {"kind": "exists", "required": False},
    }
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"format": 1, "entries": entries, "versions": {}}))
    out = run_generator("--source", str(tmp_path / "src"), "--write", table=table)
    assert out.returncode == 0, out.stderr
    written = json.loads(table.read_text())
    src = "def get_compile_pg():\n    # a comment\n    return None\n"
    assert written["versions"] == {"9.1.0": {
        "torch._dynamo.distributed.get_compile_pg": hashlib.sha256(src.encode()).hexdigest(),
        "torch._dynamo.distributed.get_helper": "(a, /, b, *args, c=, **kw)",
        "torch._dynamo.distributed.DistributedState": "(compile_pg, local_state=)",
        "torch._dynamo.distributed.DistributedState.compile_pg": True,
        "torch._C._stub.Store.wait": "(self, keys) | (self, keys, timeout)",
        "torch._dynamo.distributed.gone": None,
    }}
    # A decorated function's digest starts at its first decorator.
    helper = _compat.find(str(tmp_path / "src"), "torch._dynamo.helpers.helper")
    assert _compat.source_lines(helper) == (3, 6)
    # A required entry absent, or a call that does not bind: reported, exit 1.
    entries["torch._dynamo.distributed.gone"]["required"] = True
    entries["torch._dynamo.distributed.get_helper"]["call"] = {"args": 1, "kwargs": ["d"]}
    table.write_text(json.dumps({"format": 1, "entries": entries, "versions": {}}))
    out = run_generator("--source", str(tmp_path / "src"), "--version", "9.0.0", table=table)
    assert out.returncode == 1
    assert json.loads(out.stdout)["version"] == "9.0.0"
    assert out.stderr.splitlines() == [
        "torch-table: torch._dynamo.distributed.get_helper: (_, d=_) does not bind to "
        "(a, /, b, *args, c=, **kw)",
        "torch-table: torch._dynamo.distributed.gone: required, absent in torch 9.0.0",
    ]


def test_the_observation_is_kept_on_disk_until_a_file_it_read_changes(tmp_path, monkeypatch):
    for rel, text in FAKE.items():
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / rel).write_text(text)
    root = str(tmp_path / "src")
    entries = {
        "torch._dynamo.distributed.get_compile_pg": {"kind": "digest", "required": True},
        "torch._dynamo.distributed.DistributedState.compile_pg": {"kind": "exists",
                                                                  "required": True},
    }
    monkeypatch.setenv("CCOL_CACHE", str(tmp_path / "cache"))
    first, sites = _compat.observe_cached(root, entries)
    assert first == _compat.observe(root, entries)
    file, start, decorated = sites["torch._dynamo.distributed.get_compile_pg"]
    assert (os.path.basename(file), start, decorated) == ("distributed.py", 3, False)
    assert len(os.listdir(tmp_path / "cache" / "torch-table")) == 1
    # Kept: no source is parsed again.
    real_parse = _compat._parse

    def no_parse(path):
        raise AssertionError(f"parsed {path}")

    monkeypatch.setattr(_compat, "_parse", no_parse)
    assert _compat.observe_cached(root, entries) == (first, sites)
    # A file it read changes: parsed again, and the new value is returned.
    monkeypatch.setattr(_compat, "_parse", real_parse)
    dist_py = tmp_path / "src" / "torch" / "_dynamo" / "distributed.py"
    dist_py.write_text(dist_py.read_text().replace("# a comment", "# another comment"))
    second, _ = _compat.observe_cached(root, entries)
    assert second == _compat.observe(root, entries)
    assert second["torch._dynamo.distributed.get_compile_pg"] != \
        first["torch._dynamo.distributed.get_compile_pg"]
    # A cache that cannot be written costs only the parse.
    monkeypatch.setenv("CCOL_CACHE", str(dist_py))  # a file: no directory under it
    assert _compat.observe_cached(root, entries)[0] == second


# --------------------------------------------------------------------------
# Two ranks
# --------------------------------------------------------------------------


def test_an_untested_torch_in_a_2_rank_job(tmp_path):
    """The table without the installed version (on torch 2.15.0: without
    its 2.15.0 entry), given to both ranks by CCOL_TORCH_TABLE."""
    from conftest import run_ranks

    t = copy.deepcopy(TABLE)
    for v in [v for v in t["versions"] if same_as_installed(v)]:
        del t["versions"][v]
    table = tmp_path / "table.json"
    table.write_text(json.dumps(t))
    follow = _compat.nearest(torch.__version__, list(t["versions"]))
    named = lambda text: [p for p in TABLE["entries"] if f"{p} (" in text]  # noqa: E731
    expected = differing(TABLE["versions"], INSTALLED, follow)

    def run(case, table_file):
        (tmp_path / case).mkdir()
        env = {"CASE": case}
        if table_file:
            env["CCOL_TORCH_TABLE"] = str(table_file)
        return run_ranks(tmp_path / case, 2, "untested_torch.py", env=env, limit=240)

    for r in run("refused", table):
        done = r.event("done")
        assert done["error"] == "unsupported" and not done["enabled"], (done, r.stderr[-3000:])
        assert done["message"].startswith(
            f"compiler_collectives.torch was not tested with torch {torch.__version__}: ")
        assert named(done["message"]) == expected
        assert done["records"] == []
    for r in run("opt_in", table):
        warned = r.event("enabled")["records"]
        assert len(warned) == 1 and warned[0][:2] == ["compiler_collectives.torch", "WARNING"]
        assert warned[0][2].startswith(
            f"compiler_collectives.torch: torch {torch.__version__} is untested "
            f"(allow_untested_torch=True); following torch {follow}, ")
        assert named(warned[0][2]) == expected
        done = r.event("done")
        # The recompile at 5 stays on each rank (no guard votes: the graph
        # holds no collective): enable's check and the first compile only.
        assert done == {"ev": "done", "error": None, "compiles": [1, 2],
                        "next_exchange": 2}, r.stderr[-3000:]
        assert r.returncode == 0
    for r in run("disagree", None):
        done = r.event("done")
        assert done["error"] == "disagreement", (done, r.stderr[-3000:])
        assert "allow_untested_torch=True" in done["message"]
        assert "allow_untested_torch=False" in done["message"]
        assert not done["enabled"]
        # (The native side logs the failed exchange; the check itself warns of nothing.)
        assert [x for x in done["records"] if x[0] == "compiler_collectives.torch"] == []


def test_no_torch_group_for_functorchs_sync_in_a_2_rank_job(tmp_path):
    """With functorch's partitioner sync on and the package enabled
    (cache_agreement=True), a compile whose joint graph holds a collective
    creates no torch process group: neither Dynamo's pt2_compile_pg nor
    2.15's pt2_compile_sync_pg; the sync runs on the channel.

    The control, where torch has that group (2.15 on), creates it as
    functorch's sync does and counts it the same way. (Running the sync
    itself as the control hangs now and then: torch alone, with
    _sync_decision_cross_ranks on, deadlocked a rank in this 2-rank compile
    3 times in 26 on 2.13.0 and once in 43 on 2.15.0: docs/python.md,
    "Support matrix".)"""
    from conftest import run_ranks

    import math

    ranks = run_ranks(tmp_path, 2, "compile_sync_group.py", limit=240)
    # Each rank sums 4 ones: s = 8 on both ranks; d/dx sum(sin(x) * s) = cos(1) * 8.
    grad = [math.cos(1.0) * 8] * 4
    has_sync_pg = TABLE["versions"][INSTALLED]["torch._dynamo.distributed.get_compile_sync_pg"]
    for r in ranks:
        assert r.returncode == 0, r.stderr[-3000:]
        done = r.event("groups")
        for g in done["grads"]:
            assert g == pytest.approx(grad), done
        assert (done["new_groups"], done["tags"]) == (0, []), done
        # enable's check, the frame's exchange, the partitioner's three; the
        # graph holds an all-reduce, so the second call votes.
        assert done["exchanges"] == 6, done
        if has_sync_pg:
            control = r.event("control")
            assert (control["new_groups"], control["tags"]) == (1, ["user:pt2_compile_sync_pg"]), control
        else:
            assert not [e for e in r.events if e.get("ev") == "control"], r.events


# --------------------------------------------------------------------------
# The skip of Dynamo's restart (docs/python.md, "No second trace")
# --------------------------------------------------------------------------


def test_the_skip_of_the_restart_runs_on_each_version_read_for_it():
    marked = [p for p, e in TABLE["entries"].items() if e.get("restart_skip")]
    assert "torch._dynamo.pgo.process_automatic_dynamic" in marked
    assert "torch._dynamo.pgo.update_automatic_dynamic" in marked
    assert sorted(TABLE["restart_skip_read"]) == sorted(TABLE["versions"])
    for v, values in TABLE["versions"].items():
        assert _compat.restart_skip_gate(TABLE, values) is None, v
    # A torch whose process_automatic_dynamic reads as no version read for
    # the skip: the restart always runs, and the reason names it.
    changed = dict(TABLE["versions"][INSTALLED])
    changed["torch._dynamo.pgo.process_automatic_dynamic"] = "0" * 64
    why = _compat.restart_skip_gate(TABLE, changed)
    assert why is not None and why.startswith(
        "this torch's torch._dynamo.pgo.process_automatic_dynamic differ from torch "), why
    unread = dict(TABLE, restart_skip_read=[])
    assert _compat.restart_skip_gate(unread, TABLE["versions"][INSTALLED]) == (
        "no torch version's sources were read for the skip of the restart")


def test_the_generator_says_where_the_skip_of_the_restart_stays_off(tmp_path):
    t = copy.deepcopy(TABLE)
    t["versions"] = {}
    table = tmp_path / "table.json"
    table.write_text(json.dumps(t))
    out = run_generator("--source", ROOT, "--version", "9.9.9", "--write", table=table)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        "torch-table: torch 9.9.9: Dynamo's restart is never skipped there (no torch version's "
        "sources were read for the skip of the restart); read those sources against "
        "_restart.py's rule, then add the version to the table's restart_skip_read"]


def test_on_a_torch_not_read_for_the_skip_every_exchanged_compile_restarts(
        world_of_one, tmp_path, monkeypatch, caplog):
    from torch._dynamo.utils import counters

    installed_table = _compat.TABLE
    t = copy.deepcopy(TABLE)
    t["restart_skip_read"] = [v for v in t["versions"] if not same_as_installed(v)]
    path = tmp_path / "table.json"
    path.write_text(json.dumps(t))
    monkeypatch.setattr(_compat, "TABLE", str(path))
    torch._dynamo.reset()
    counters.clear()
    caplog.set_level(logging.INFO, logger=LOGGER)
    cct.enable(timeout=20)
    try:
        assert cct.channel_info()["skip_restart"] is False
        assert count_compiles((3, 3)) == [1]
        assert dict(counters["compiler_collectives"]) == {"restarted": 1}
    finally:
        cct.disable()
    said = [r.getMessage() for r in caplog.records
            if "restart after each frame exchange always runs" in r.getMessage()]
    assert len(said) == 1 and "differ from torch " in said[0], said
    # The installed table: the first compile in a world of one skips it.
    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(_compat, "TABLE", installed_table)
    cct.enable(timeout=20)
    try:
        assert cct.channel_info()["skip_restart"] is True
        assert count_compiles((3, 3)) == [1]
        assert dict(counters["compiler_collectives"]) == {"restart_skipped": 1}
    finally:
        cct.disable()
