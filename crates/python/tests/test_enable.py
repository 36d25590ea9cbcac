"""enable()/disable() in one process (a world of one): what they check,
what they replace and restore, the errors' fields."""

from __future__ import annotations

import datetime
import pickle

import pytest
import torch
import torch.distributed as dist

import compiler_collectives
import compiler_collectives.torch as cct
from compiler_collectives import _checks, _errors, _votes

from conftest import count_compiles, replaced_objects  # world_of_one is conftest's fixture too


def test_enable_before_init_process_group_is_refused():
    if dist.is_initialized():
        pytest.skip("the module's process group is up")
    with pytest.raises(compiler_collectives.InvalidArgument, match="init_process_group"):
        cct.enable()
    assert not cct.is_enabled()


def test_enable_replaces_and_disable_restores_everything(world_of_one):
    from torch._C._dynamo.eval_frame import set_guard_complete_hook

    before = replaced_objects()
    cct.enable(timeout=20, guard_votes=True)
    during = replaced_objects()
    for name in before:
        if name == "enable_compiler_collectives":
            assert during[name] is True
        else:
            assert during[name] is not before[name], name
    # Our guard vote is the installed hook.
    assert set_guard_complete_hook(_votes.guard_vote) is _votes.guard_vote
    info = cct.channel_info()
    assert info["rank"] == 0 and info["world_size"] == 1 and info["timeout_s"] == 20
    assert info["guard_votes"] is True
    assert info["next_exchange"] == 1  # the enable check was #0
    cct.disable()
    after = replaced_objects()
    assert after == before
    assert set_guard_complete_hook(None) is None
    assert cct.channel_info() is None
    cct.disable()  # idempotent


def test_enable_twice_is_refused(world_of_one):
    cct.enable(timeout=20)
    try:
        with pytest.raises(compiler_collectives.InvalidArgument, match="already enabled"):
            cct.enable(timeout=20)
    finally:
        cct.disable()


def test_compiles_in_a_world_of_one_take_one_exchange_each(world_of_one):
    torch._dynamo.reset()
    cct.enable(timeout=20, exchange="always")
    try:
        compiles = count_compiles((3, 3, 5, 7))
        # Step 0 compiles static, step 2 recompiles with dim 0 dynamic (a
        # symbol and the tensor), step 3 hits: two exchanges after enable's.
        assert compiles == [1, 2]
        assert cct.channel_info()["next_exchange"] == 3
    finally:
        cct.disable()


def test_another_torch_version_is_refused_and_nothing_changes(world_of_one, monkeypatch, tmp_path):
    """A torch that matches no version of the table (here: a table without
    the installed version, and a newer version string) is refused, naming
    the version and what differs from the newest known version."""
    import json

    from compiler_collectives import _compat

    installed = _compat.plain(torch.__version__)
    table = _compat.load_table()
    for v in [v for v, values in table["versions"].items()
              if values == table["versions"][installed]]:
        del table["versions"][v]  # the installed one, and any identical (2.14.0 to 2.14.1)
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    monkeypatch.setattr(_compat, "TABLE", str(path))
    before = replaced_objects()
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    newest = max(table["versions"], key=_compat.release)
    with pytest.raises(compiler_collectives.IncompatibleTorch, match="torch 2.99.0") as e:
        cct.enable()
    assert f"Compared with torch {newest}, the nearest: " in str(e.value)
    assert e.value.kind == "unsupported"
    assert replaced_objects() == before
    assert not cct.is_enabled()


def test_another_version_string_alone_is_accepted(world_of_one, monkeypatch):
    """What is compared is torch's source, not its version string."""
    from compiler_collectives import _compat

    installed = _compat.plain(torch.__version__)
    monkeypatch.setattr(torch, "__version__", "2.99.0+local")
    decision = _checks.check_torch()
    assert (decision.version, decision.matched, decision.warning) == (installed, True, None)


def test_a_changed_torch_function_is_refused_naming_it(world_of_one, monkeypatch):
    import torch._dynamo.output_graph as og

    def run_compiler_collective(self):  # another body than torch's
        return None

    before = replaced_objects()
    monkeypatch.setattr(og.OutputGraph, "run_compiler_collective", run_compiler_collective)
    with pytest.raises(compiler_collectives.IncompatibleTorch) as e:
        cct.enable()
    code = run_compiler_collective.__code__
    assert (
        "torch._dynamo.output_graph.OutputGraph.run_compiler_collective (replaced at run time: "
        f"the live object is {run_compiler_collective.__module__}."
        f"{run_compiler_collective.__qualname__} ({code.co_filename}:{code.co_firstlineno}), "
        "not torch's source)" in str(e.value)
    )
    assert e.value.kind == "unsupported"
    assert not cct.is_enabled()
    monkeypatch.undo()
    assert replaced_objects() == before


@pytest.mark.parametrize(
    "timeout, env, match",
    [
        (-1, None, "positive"),
        (0, None, "positive"),
        (float("nan"), None, "positive"),
        (float("inf"), None, "positive"),
        (True, None, "seconds"),
        ("10", None, "seconds"),
        (1e9, None, "at most ten years"),
        (1e20, None, "at most ten years"),
        (datetime.timedelta.max, None, "at most ten years"),
        (None, "soon", "CCOL_TIMEOUT_S='soon'"),
        (None, "-3", "CCOL_TIMEOUT_S='-3'"),
    ],
)
def test_bad_deadlines_are_refused(world_of_one, monkeypatch, timeout, env, match):
    if env is not None:
        monkeypatch.setenv("CCOL_TIMEOUT_S", env)
    with pytest.raises(compiler_collectives.InvalidArgument, match=match):
        cct.enable(timeout=timeout)
    assert not cct.is_enabled()


@pytest.mark.parametrize("value", ["junk", "1", "0", "-4", "2.5", "4294967296"])
def test_a_bad_hierarchical_from_is_refused_naming_it(world_of_one, monkeypatch, value):
    monkeypatch.setenv("CCOL_HIERARCHICAL_FROM", value)
    with pytest.raises(compiler_collectives.InvalidArgument,
                       match=f"CCOL_HIERARCHICAL_FROM=\"{value}\": expected a world size from 2"):
        cct.enable(timeout=10)
    assert not cct.is_enabled()


def test_a_good_hierarchical_from_is_accepted(world_of_one, monkeypatch):
    # A world of one rank stays flat (the tree starts at 2 at the lowest);
    # test_ranks' fold-rule test runs 2 ranks over the tree.
    for value in ("2", " 64 "):
        monkeypatch.setenv("CCOL_HIERARCHICAL_FROM", value)
        cct.enable(timeout=10)
        assert cct.channel_info()["topology"] == "flat"
        cct.disable()
    monkeypatch.delenv("CCOL_HIERARCHICAL_FROM")


@pytest.mark.parametrize(
    "group, match",
    [
        ([1], r"ranks \[1\] are not all in a job of 1 ranks"),
        ([0, 0], r"a rank is listed twice in \[0, 0\]"),
        ([], "non-empty list of job ranks"),
        ([True], "non-empty list of job ranks"),
        (["0"], "non-empty list of job ranks"),
        ("0", "group must be None"),
        (3, "group must be None"),
    ],
)
def test_a_bad_group_is_refused_and_nothing_changes(world_of_one, group, match):
    with pytest.raises(compiler_collectives.InvalidArgument, match=match):
        cct.enable(timeout=10, group=group)
    assert not cct.is_enabled()


def test_a_mesh_dimension_is_taken_by_its_name(world_of_one):
    # (mesh, 0) was refused as "a list of job ranks" (a new user's attack).
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    with pytest.raises(compiler_collectives.InvalidArgument,
                       match=r"takes the dimension by its name \(a str\), not 0 "
                             r"\(the mesh's dimensions: \['dp'\]\)"):
        cct.enable(timeout=10, group=(mesh, 0))
    with pytest.raises(compiler_collectives.InvalidArgument, match="has no dimension 'pp'"):
        cct.enable(timeout=10, group=(mesh, "pp"))
    assert not cct.is_enabled()
    cct.enable(timeout=10, group=(mesh, "dp"))
    assert cct.channel_info()["group"] == [0]
    cct.disable()


def test_a_group_this_rank_is_not_in_is_refused_naming_it(world_of_one):
    # What dist.new_group gives a rank outside the group.
    import torch.distributed as dist

    with pytest.raises(compiler_collectives.InvalidArgument,
                       match="rank 0 is not a member of the ProcessGroup"):
        cct.enable(timeout=10, group=dist.GroupMember.NON_GROUP_MEMBER)
    assert not cct.is_enabled()


def test_the_world_as_a_group_is_the_default(world_of_one):
    # A world of one: [0], range(1) and the default group's ProcessGroup all
    # name the same ranks as None.
    import torch.distributed as dist

    for group in (None, [0], range(1), dist.group.WORLD):
        cct.enable(timeout=10, group=group)
        info = cct.channel_info()
        assert (info["rank"], info["world_size"], info["group"]) == (0, 1, [0]), group
        cct.disable()


def test_deadline_sources_in_order(world_of_one, monkeypatch):
    monkeypatch.setenv("CCOL_TIMEOUT_S", "42")
    assert _checks.timeout_seconds(None) == 42.0
    assert _checks.timeout_seconds(7) == 7.0
    assert _checks.timeout_seconds(datetime.timedelta(minutes=2)) == 120.0
    monkeypatch.delenv("CCOL_TIMEOUT_S")
    assert _checks.timeout_seconds(None) == 300.0


@pytest.mark.parametrize("bad", ["yes", "Auto", 1, None])
def test_guard_votes_must_be_a_bool_or_auto(world_of_one, bad):
    with pytest.raises(compiler_collectives.InvalidArgument,
                       match=r"guard_votes must be True, False or 'auto'"):
        cct.enable(guard_votes=bad)
    assert not cct.is_enabled()


@pytest.mark.parametrize("bad", ["never", "AUTO", True, None, 0])
def test_exchange_must_be_auto_or_always(world_of_one, bad):
    with pytest.raises(compiler_collectives.InvalidArgument,
                       match=r"exchange must be 'auto' or 'always'"):
        cct.enable(exchange=bad)
    assert not cct.is_enabled()


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_skip_restart_must_be_a_bool(world_of_one, bad):
    with pytest.raises(compiler_collectives.InvalidArgument,
                       match=r"skip_restart must be a bool"):
        cct.enable(skip_restart=bad)
    assert not cct.is_enabled()


def test_a_recompile_in_a_world_of_one_is_local_under_the_default(world_of_one):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    before = counters["compiler_collectives"]["local_compile"]
    cct.enable(timeout=20)
    try:
        info = cct.channel_info()
        assert (info["exchange"], info["guard_votes"], info["votes_on"]) == ("auto", "auto", False)
        compiles = count_compiles((3, 3, 5, 7))
        # The first compile is exchanged; the recompile at 5 (dim 0 dynamic,
        # from this rank's own code state) is local and counted.
        assert compiles == [1, 2]
        assert cct.channel_info()["next_exchange"] == 2
        assert counters["compiler_collectives"]["local_compile"] - before == 1
    finally:
        cct.disable()


def test_local_outside_enable_changes_nothing():
    import torch._dynamo.pgo as pgo

    assert not cct.is_enabled()
    state = pgo._CODE_STATE
    with cct.local():
        with cct.local():  # nests
            pass
    assert pgo._CODE_STATE is state


def test_errors_report_their_public_path():
    for name in ("Error", "Timeout", "PeerLost", "Desync", "GraphMismatch", "IncompatibleTorch"):
        cls = getattr(compiler_collectives, name)
        assert cls.__module__ == "compiler_collectives", cls
        assert f"{cls.__module__}.{cls.__qualname__}" == f"compiler_collectives.{name}"
    e = compiler_collectives.Timeout("t", missing_ranks=[1], exchange=2, key="k")
    assert repr(type(e)) == "<class 'compiler_collectives.Timeout'>"
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is compiler_collectives.Timeout and back.missing_ranks == [1]


def test_errors_form_one_hierarchy_with_their_kinds():
    from compiler_collectives._native import ERROR_CLASSES

    kinds = {
        "timeout": compiler_collectives.Timeout,
        "peer_lost": compiler_collectives.PeerLost,
        "desync": compiler_collectives.Desync,
        "version_mismatch": compiler_collectives.VersionMismatch,
        "disagreement": compiler_collectives.Disagreement,
        "decode": compiler_collectives.DecodeError,
        "backend": compiler_collectives.BackendError,
        "invalid_argument": compiler_collectives.InvalidArgument,
        "unsupported": compiler_collectives.Unsupported,
        "channel_unusable": compiler_collectives.ChannelUnusable,
    }
    # The extension chooses the class from core's ErrorKind: every kind core
    # has (ErrorKind::ALL) has its own class here, whose kind is its name.
    assert dict(ERROR_CLASSES) == {k: cls.__name__ for k, cls in kinds.items()}
    for kind, cls in kinds.items():
        e = _errors._from_native(cls.__name__, kind, f"text of {kind}", [1, 3], 4, "k", 3,
                                 [(1, "shutdown")])
        assert type(e) is cls and isinstance(e, compiler_collectives.Error)
        # The message as core wrote it, ending with a period.
        assert (e.kind, str(e), e.missing_ranks, e.exchange, e.key, e.last_completed) == (
            kind, f"text of {kind}.", [1, 3], 4, "k", 3,
        )
        assert e.departures == [(1, "shutdown")]
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is cls and back.missing_ranks == [1, 3] and str(back) == str(e)
    # A kind this Python side has no class for yet is still an Error, with its kind.
    new = _errors._from_native("Error", "new_kind", "t", [], None, None, None, [])
    assert type(new) is compiler_collectives.Error and new.kind == "new_kind"
    mismatch = compiler_collectives.GraphMismatch("graphs differ", groups=[[0, 2], [1]],
                                                  key="k", exchange=5, last_completed=6)
    assert isinstance(mismatch, compiler_collectives.Disagreement)
    back = pickle.loads(pickle.dumps(mismatch))
    assert (type(back), back.groups, str(back), back.kind) == (
        compiler_collectives.GraphMismatch, [[0, 2], [1]], "graphs differ", "disagreement"
    )
    assert (back.key, back.exchange, back.last_completed) == ("k", 5, 6)
    assert issubclass(compiler_collectives.Timeout, TimeoutError)
    assert issubclass(compiler_collectives.InvalidArgument, ValueError)


def test_the_package_imports_without_torch_and_says_its_versions():
    import subprocess
    import sys

    code = (
        "import sys, compiler_collectives as c; "
        "assert 'torch' not in sys.modules, 'imported torch'; "
        "print(c.__version__, c.WIRE_VERSION)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    version, wire = out.stdout.split()
    assert version == compiler_collectives.__version__
    assert int(wire) == compiler_collectives.WIRE_VERSION >= 1


def test_the_native_sides_log_events_reach_pythons_logging(world_of_one, caplog):
    # Each exchange logs "exchange done" (DEBUG, target ccol::exchange) in
    # Rust; with the compiler_collectives logger at DEBUG it reaches logging
    # by the time the compiled call returns.
    import logging

    caplog.set_level(logging.DEBUG, logger="compiler_collectives")
    cct.enable(timeout=20)
    try:
        @torch.compile(backend="eager")
        def g(x):
            return x + 1

        g(torch.ones(3))
        done = [r for r in caplog.records if r.name == "compiler_collectives.exchange"]
        assert done, [(r.name, r.getMessage()) for r in caplog.records]
        assert done[-1].levelno == logging.DEBUG
        assert done[-1].getMessage().startswith("exchange done")
        assert "outcome=\"ok\"" in done[-1].getMessage() or "outcome=ok" in done[-1].getMessage()
        # Which exchange: this rank, the exchange's number and its key.
        assert " rank=0 exchange=1 key=torch.frame " in done[-1].getMessage(), done[-1].getMessage()
    finally:
        cct.disable()
    # Below the logger's level nothing is formatted or handed over.
    caplog.clear()
    caplog.set_level(logging.WARNING, logger="compiler_collectives")
    cct.enable(timeout=20)
    try:
        @torch.compile(backend="eager")
        def h(x):
            return x + 2

        h(torch.ones(3))
        assert not [r for r in caplog.records if r.name.startswith("compiler_collectives.")]
    finally:
        cct.disable()


def test_a_lazily_compiled_backward_follows_its_forwards_mode(world_of_one):
    # AOTAutograd compiles a backward at the first .backward(), outside
    # Dynamo's compile: the agreements inside it (Inductor's SPMD check,
    # autotuning) follow the forward's mode, found by its compile id.
    from torch._dynamo.backends.common import aot_autograd

    from compiler_collectives import _policy

    seen = []

    def compiler(which):
        def compile_graph(gm, _example_inputs):
            seen.append((which, _policy.exchanging(), _policy.current() is None))
            return gm.forward

        return compile_graph

    torch._dynamo.reset()
    cct.enable(timeout=20)
    try:
        @torch.compile(backend=aot_autograd(fw_compiler=compiler("fw"), bw_compiler=compiler("bw")))
        def f(x):
            return x.sin().sum()

        f(torch.ones(4, requires_grad=True)).backward()
        with cct.local():
            # A recompile inside local() (a new dtype: static shapes, so
            # AOTAutograd defers the backward's compile).
            out = f(torch.ones(4, dtype=torch.float64, requires_grad=True))
        out.backward()  # outside local(): the backward of a local compile
        with cct.local():
            f(torch.ones(4, requires_grad=True)).backward()  # hits: nothing compiled
    finally:
        cct.disable()
    # (which, exchanging, compiled lazily outside Dynamo's compile)
    assert seen == [("fw", True, False), ("bw", True, True), ("fw", False, False),
                    ("bw", False, True)], seen


def test_a_switch_turned_on_after_enable_is_refused_at_the_next_compile(world_of_one):
    import torch._functorch.config as functorch_config

    torch._dynamo.reset()
    cct.enable(timeout=20)
    try:
        functorch_config._sync_decision_cross_ranks = True

        @torch.compile(backend="eager")
        def f(x):
            return x + 1

        with pytest.raises(compiler_collectives.InvalidArgument) as raised:
            f(torch.ones(2))
        assert ("torch._functorch.config._sync_decision_cross_ranks (False at enable(), True "
                "now)") in str(raised.value)
        assert "Set it before compiler_collectives.torch.enable(), on every rank." in str(
            raised.value)
    finally:
        functorch_config._sync_decision_cross_ranks = False
        cct.disable()


def test_enable_leaves_the_inductor_agreements_until_torch_imports_them(tmp_path):
    # In a fresh process: enable() does not import Inductor's autotuning
    # module (about 590 modules); importing it installs the agreement.
    import subprocess
    import sys

    code = f"""
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
import compiler_collectives.torch as cct
cct.enable(timeout=20)
print("after enable", "torch._inductor.distributed_autotune" in sys.modules)
import torch._inductor.distributed_autotune as da
print("installed", da.get_autotune_pg.__module__, da.get_autotune_pg().size())
cct.disable()
print("restored", da.get_autotune_pg.__module__)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "after enable False", out.stdout
    assert lines[1] == "installed compiler_collectives._autotune 1", out.stdout
    assert lines[2] == "restored torch._inductor.distributed_autotune", out.stdout


def test_a_notice_from_another_rank_is_printed_once_without_control_characters(capsys):
    from compiler_collectives import _notice

    _notice.report(b"1\nbad \x1b[31mred\x1b[0m line\x07", 0)
    _notice.report(b"0\nthis rank's own notice", 0)  # not printed
    assert capsys.readouterr().err == "bad [31mred [0m line\n"
    _notice.report(b"x" * 10_000, 0)  # no rank: printed as it is, cut
    assert capsys.readouterr().err == "x" * _notice.MAX_LINE + "\n"
    line = _notice.failure_line(3, compiler_collectives.Timeout(
        "timed out\nwaiting", missing_ranks=[1], exchange=2, key="torch.frame m:f:1#0"))
    assert line == ("compiler_collectives: job rank 3 failed: Timeout (timeout) in exchange #2 "
                    "'torch.frame m:f:1#0': timed out waiting")
    # A rank whose channel closed before it died (Ctrl-C during a wait): no
    # exchange number to give (a new user's attack read "before its first").
    assert _notice.crash_line(0, KeyboardInterrupt, "", None) == (
        "compiler_collectives: job rank 0 failed: it is exiting on an uncaught "
        "KeyboardInterrupt (crashed) after its channel closed: ")
    assert _notice.crash_line(1, RuntimeError, "boom", 2).endswith(
        "RuntimeError (crashed) after exchange #1: boom")


def test_core_errors_read_as_this_packages_advice():
    # Core's "abort it" names a call this package does not have; a
    # sentence ends before the next (a new user's attack).
    e = _errors._from_native(
        "Timeout", "timeout", "timed out after 5 ms waiting for rank [1] in exchange #2 'k' "
        "(last exchange completed with every rank: #1); the channel is unusable: abort it",
        [1], 2, "torch.frame m:f:1#0", 1, [])
    assert e.message.endswith("; the channel is unusable: end the job (or call "
                              "compiler_collectives.torch.disable()).")
    from compiler_collectives import _surface

    _surface.with_hint(e)
    assert e.message.endswith("disable()). If a compiled call is made on some ranks only (an "
                              "evaluation on rank 0), make it inside "
                              "compiler_collectives.torch.local().")
    assert str(e) == e.message
