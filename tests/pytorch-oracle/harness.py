#!/usr/bin/env python3
"""The PyTorch oracle: runs a scenario file (docs/scenarios.md) on real PyTorch Dynamo.

Each rank is a CPU process joined to the others by a Gloo process group
(``init_process_group("cpu:gloo")`` over a FileStore on loopback). Every rank
compiles the scenario's program with ``torch.compile`` and a counting
backend, calls it once per step, and records the frame compiles, the steps
they happened at, and the dynamic size / stride dims of the last compiled
graph. The output is the JSON of ``ccol scenario run --json``.

Usage::

    harness.py FILE [--collectives|--no-collectives]
                    [--guard-collectives|--no-guard-collectives] [--json]
    harness.py --batch [--mode MODE]... [--finishing] [--detail-dir DIR] FILE...
    harness.py --compare-detail DIR

The first form prints one line of JSON (keys sorted) and exits 0, or 3 when a
rank failed (PyTorch hung: the harness's own deadline fired), 2 for a
malformed file, 4 when PyTorch cannot express the scenario. The second form
runs every FILE in every given MODE (default: each mode the file has an
``expect`` for) and prints one JSON line per job: ``{"file", "name", "mode",
"status": "ok"|"failed"|"unsupported"|"malformed", "output", "reason"}``.
Jobs of one world size share one set of rank processes (Dynamo is reset
between jobs); a job that hangs gets a fresh set for the jobs after it.
With ``--detail-dir`` each job also records, per rank, every compile's FX
graph code, after each step the guards of the frame's cache entries and the
code state Dynamo wrote, and the package's restart counts, in a file under
``DIR/<exchange>/``; the third form compares the package's files with
PyTorch's (README.md, "Traces equal to PyTorch's").

What the harness changes in PyTorch: exactly one thing, the device context
around the all_gather of ``OutputGraph.run_compiler_collective``
(``get_interface_for_device(...).device(rank % torch.accelerator.device_count())``),
which divides by zero on a machine without an accelerator. The method is
recompiled from PyTorch's own installed source with that one expression
replaced by ``contextlib.nullcontext()``; the harness fails if the text is not
found exactly once. It also wraps ``torch.distributed.all_gather_object`` to
report when a rank enters and leaves an exchange (the call itself is passed
through unchanged). See README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import keyword
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback

MODES = [
    "collectives",
    "no_collectives",
    "guard_collectives",
    "collectives_and_guard_collectives",
]
MODE_FLAGS = {
    "collectives": (True, False),
    "no_collectives": (False, False),
    "guard_collectives": (False, True),
    "collectives_and_guard_collectives": (True, True),
}

EXIT_OK = 0
EXIT_MALFORMED = 2
EXIT_RANK_FAILED = 3
EXIT_UNSUPPORTED = 4

# The largest tensor the harness allocates for one input (elements).
MAX_ELEMENTS = 1 << 24


#: What differs between processes in Dynamo's guard text: object ids and
#: addresses, and the counter that numbers the globals Dynamo installs
#: (``__builtins_dict___7``: one count per process).
_IDS = re.compile(r"0x[0-9a-fA-F]+|\b\d{7,}\b")
_INSTALLED = re.compile(r"(___)\d+\b")


def mask_ids(text: str) -> str:
    """``text`` with every object id (an integer of 7 or more digits) and
    address (``0x…``) replaced by ``<id>``, and the number of each global
    Dynamo installed by ``<n>``."""
    return _INSTALLED.sub(r"\1<n>", _IDS.sub("<id>", text))


def mode_of(collectives: bool, votes: bool) -> str:
    for name, flags in MODE_FLAGS.items():
        if flags == (collectives, votes):
            return name
    raise AssertionError("unreachable")


def dumps(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


# --------------------------------------------------------------------------
# Scenario files
# --------------------------------------------------------------------------


class Malformed(Exception):
    pass


class Unsupported(Exception):
    pass


IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _nat_list(v, field):
    if not isinstance(v, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v
    ):
        raise Malformed(f"field `{field}`: expected a list of non-negative integers")
    return v


class _NegativeZero(int):
    """The JSON number `-0`: the int 0, or -0.0 as a float's value."""


def _float(v, where):
    """A float input's value: a JSON number, or "nan", "inf", "-inf"."""
    import math

    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise Malformed(f"{where}: expected a number, or \"nan\", \"inf\" or \"-inf\"")
    if isinstance(v, str):
        if v not in ("nan", "inf", "-inf"):
            raise Malformed(f"{where}: expected a number, or \"nan\", \"inf\" or \"-inf\"")
        return v
    if isinstance(v, _NegativeZero):
        return -0.0
    if isinstance(v, float) and not math.isfinite(v):
        raise Malformed(f"{where}: write a non-finite float as \"nan\", \"inf\" or \"-inf\"")
    return v


def load_scenario(path: str) -> dict:
    """Reads and checks a scenario file (the subset of ccol's validation the
    harness relies on; ccol itself is the strict validator)."""
    try:
        with open(path, "rb") as f:
            # `-0` keeps its sign as a float's value (ccol's reader does too).
            raw = json.loads(f.read(), parse_int=lambda t: _NegativeZero() if t == "-0" else int(t))
    except (OSError, ValueError) as e:
        raise Malformed(f"{path}: {e}") from e
    if not isinstance(raw, dict):
        raise Malformed(f"{path}: a scenario file is one JSON object")
    known = {
        "name", "description", "world_size", "options", "steps", "expect",
        "warm_cache", "mark_dynamic",
    }
    for k in raw:
        if k not in known:
            raise Malformed(f"{path}: unknown field `{k}`")
    name = raw.get("name")
    ws = raw.get("world_size")
    steps = raw.get("steps")
    if not isinstance(name, str):
        raise Malformed(f"{path}: field `name`: expected a string")
    if not isinstance(ws, int) or isinstance(ws, bool) or not 1 <= ws <= 65536:
        raise Malformed(f"{path}: field `world_size`: expected 1..=65536")
    if not isinstance(steps, list):
        raise Malformed(f"{path}: field `steps`: expected a list")
    opts = raw.get("options") or {}
    if not isinstance(opts, dict):
        raise Malformed(f"{path}: field `options`: expected an object")
    options = {
        "collectives": opts.get("collectives", True),
        "guard_collectives": opts.get("guard_collectives", False),
        "recompile_limit": opts.get("recompile_limit", 8),
        "specialize_zero_one": opts.get("specialize_zero_one", True),
        "duck_sizing": opts.get("duck_sizing", False),
        "overrides": opts.get("overrides", {}) or {},
        "artifact_cache": opts.get("artifact_cache", "warm_cache" in raw),
        "cache_hit_agreement": opts.get("cache_hit_agreement", True),
        "automatic_dynamic_shapes": opts.get("automatic_dynamic_shapes", True),
        "automatic_dynamic_exclusion_guard": opts.get("automatic_dynamic_exclusion_guard", False),
    }
    for k in opts:
        if k not in options:
            raise Malformed(f"{path}: unknown field `options.{k}`")
    for k in ("automatic_dynamic_shapes", "automatic_dynamic_exclusion_guard"):
        if not isinstance(options[k], bool):
            raise Malformed(f"{path}: field `options.{k}`: expected a boolean")
    sources = set()
    norm_steps = []
    for s, step in enumerate(steps):
        if not isinstance(step, list) or len(step) != ws:
            raise Malformed(f"{path}: field `steps[{s}]`: expected {ws} rank entries")
        norm_step = []
        for r, inputs in enumerate(step):
            if not isinstance(inputs, dict):
                raise Malformed(f"{path}: field `steps[{s}][{r}]`: expected an object")
            norm = {}
            for src, inp in inputs.items():
                field = f"steps[{s}][{r}].{src}"
                if not IDENT.match(src):
                    raise Malformed(f"{path}: field `{field}`: not an identifier")
                sources.add(src)
                if inp is None:
                    norm[src] = None
                    continue
                if not isinstance(inp, dict) or not set(inp) <= {"size", "stride", "int", "float", "bool"}:
                    raise Malformed(f"{path}: field `{field}`: expected size/stride, int, float or bool")
                if set(inp) == {"float"}:
                    norm[src] = {"float": _float(inp["float"], f"{path}: field `{field}.float`")}
                    continue
                if set(inp) == {"bool"}:
                    if not isinstance(inp["bool"], bool):
                        raise Malformed(f"{path}: field `{field}.bool`: expected true or false")
                    norm[src] = {"bool": inp["bool"]}
                    continue
                if "size" in inp and "int" not in inp:
                    size = _nat_list(inp["size"], field + ".size")
                    stride = inp.get("stride")
                    if stride is not None:
                        stride = _nat_list(stride, field + ".stride")
                        if len(stride) != len(size):
                            raise Malformed(
                                f"{path}: field `{field}.stride`: "
                                f"{len(stride)} strides for {len(size)} sizes"
                            )
                    norm[src] = {"size": size, "stride": stride}
                elif "int" in inp and "size" not in inp and "stride" not in inp:
                    v = inp["int"]
                    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                        raise Malformed(f"{path}: field `{field}.int`: expected an int >= 0")
                    norm[src] = {"int": v}
                else:
                    raise Malformed(f"{path}: field `{field}`: give `size` or `int`")
            norm_step.append(norm)
        norm_steps.append(norm_step)
    expect = raw.get("expect") or {}
    if not isinstance(expect, dict) or not all(k in MODE_FLAGS for k in expect):
        raise Malformed(f"{path}: field `expect`: keys are modes {MODES}")
    return {
        "file": path,
        "name": name,
        "world_size": ws,
        "options": options,
        "sources": sorted(sources),
        "steps": norm_steps,
        "expect": expect,
        "mark_dynamic": raw.get("mark_dynamic") or {},
    }


def unsupported_reason(sc: dict) -> str | None:
    """Why PyTorch cannot express this scenario, or None."""
    o = sc["options"]
    if o["specialize_zero_one"] is not True:
        return (
            "options.specialize_zero_one = false: Dynamo always specialises sizes 0 "
            "and 1 (its ShapeEnv is built with the default specialize_zero_one=True; "
            "no config knob)"
        )
    if o["duck_sizing"] is not False:
        return (
            "options.duck_sizing = true: Dynamo never duck-sizes automatic-dynamic "
            "dims (they are DimDynamic.DYNAMIC; ShapeEnv duck-shapes only "
            "DimDynamic.DUCK dims, i.e. compiles with dynamic=True)"
        )
    if o["overrides"]:
        return (
            "options.overrides: Dynamo has no per-source force_static/force_dynamic "
            "that covers both tensors and ints with these semantics"
        )
    if o["artifact_cache"]:
        return (
            "warm_cache / options.artifact_cache: the harness does not model per-rank "
            "persistent artifact caches (PyTorch's FX graph cache has no cache-hit "
            "agreement to compare with)"
        )
    if sc["mark_dynamic"]:
        return "mark_dynamic: the harness does not apply per-rank mark_dynamic hints yet"
    if not isinstance(o["recompile_limit"], int) or o["recompile_limit"] < 0:
        return "options.recompile_limit must be a non-negative int"
    for src in sc["sources"]:
        if keyword.iskeyword(src) or src.startswith("_ccol"):
            return f"source name `{src}` cannot be a Python parameter name"
    for step in sc["steps"]:
        for inputs in step:
            for src, inp in inputs.items():
                if inp is not None and "size" in inp:
                    size, stride = inp["size"], inp["stride"]
                    if stride is None:
                        n = 1
                        for d in size:
                            n *= d
                    else:
                        n = 1 if all(d > 0 for d in size) else 0
                        if n:
                            n += sum((d - 1) * st for d, st in zip(size, stride))
                    if n > MAX_ELEMENTS:
                        return f"input `{src}` needs {n} elements (over {MAX_ELEMENTS})"
    return None


# --------------------------------------------------------------------------
# Rank processes (workers)
# --------------------------------------------------------------------------


def _patch_compiler_collective_device_context() -> None:
    """Replaces, in this process, the device context around the all_gather
    of ``OutputGraph.run_compiler_collective`` with ``nullcontext()``.

    PyTorch 2.13 enters ``get_interface_for_device(t).device(rank %
    torch.accelerator.device_count())`` there, which raises
    ZeroDivisionError without an accelerator. Everything else of the method
    is PyTorch's own installed source."""
    import contextlib
    import inspect
    import textwrap

    import torch._dynamo.output_graph as og

    src = textwrap.dedent(inspect.getsource(og.OutputGraph.run_compiler_collective))
    pattern = re.compile(
        r"get_interface_for_device\(device_types\.pop\(\)\)\.device\([^\n]*\n"
        r"\s*compile_pg\.rank\(\) % torch\.accelerator\.device_count\(\)\s*\)"
    )
    new, n = pattern.subn("_ccol_contextlib.nullcontext()", src)
    if n != 1:
        raise RuntimeError(
            "harness: the device context of OutputGraph.run_compiler_collective was "
            f"found {n} times (expected once); this torch is not the one the harness "
            "was written for"
        )
    namespace: dict = {}
    scope = dict(og.__dict__)
    scope["_ccol_contextlib"] = contextlib
    exec(compile(new, og.__file__, "exec"), scope, namespace)  # noqa: S102
    og.OutputGraph.run_compiler_collective = namespace["run_compiler_collective"]


#: The torch.distributed calls that would run a collective on, or create, a
#: torch process group. With ``--exchange package`` the harness counts them
#: during a job's steps: the package must call none.
TORCH_COLLECTIVES = [
    "all_gather_object", "all_gather", "all_reduce", "broadcast", "broadcast_object_list",
    "barrier", "gather_object", "scatter_object_list", "all_to_all", "reduce", "new_group",
]


class Worker:
    def __init__(self, rank: int, world_size: int, store: str, pg_timeout: float,
                 exchange: str = "pytorch"):
        # Events go to the original stdout; everything else prints to stderr.
        self.events = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self.rank = rank
        self.world_size = world_size
        import datetime

        import torch
        import torch.distributed as dist

        self.torch = torch
        self.dist = dist
        self.exchange = exchange
        self.package = None
        if exchange == "package":
            # No patch: the package replaces the exchange whole.
            import compiler_collectives.torch as package

            self.package = package
        else:
            _patch_compiler_collective_device_context()
        dist.init_process_group(
            "cpu:gloo",
            init_method=f"file://{store}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=pg_timeout),
        )
        self.job = None
        self.step = None
        self.detail = False
        self.exchanges = 0
        self.records = []
        real_all_gather_object = dist.all_gather_object
        worker = self

        def all_gather_object(object_list, obj, group=None):
            # Observation only: report entering and leaving, pass through.
            from torch._dynamo import distributed as dd

            kind = None
            if group is not None and group is dd._COMPILE_PG:
                kind = "compiler_collective"
            elif group is not None and group is dd._GUARD_PG:
                kind = "guard_collective"
            if kind is None or worker.job is None:
                return real_all_gather_object(object_list, obj, group=group)
            seq = worker.exchanges
            worker.exchanges += 1
            worker.emit(ev="enter", seq=seq, kind=kind, step=worker.step)
            out = real_all_gather_object(object_list, obj, group=group)
            worker.emit(ev="leave", seq=seq)
            return out

        dist.all_gather_object = all_gather_object
        # Counts torch collectives and group creation during a job's steps.
        self.in_steps = False
        self.torch_calls = {}
        import torch.distributed.distributed_c10d as c10d

        def counted(owner, name):
            real = getattr(owner, name)

            def call(*args, **kwargs):
                if worker.in_steps:
                    worker.torch_calls[name] = worker.torch_calls.get(name, 0) + 1
                return real(*args, **kwargs)

            setattr(owner, name, call)

        for name in TORCH_COLLECTIVES:
            if hasattr(dist, name):
                counted(dist, name)
        counted(c10d, "_new_group_with_tag")
        self.emit(ev="ready")

    def emit(self, **ev) -> None:
        ev["rank"] = self.rank
        if self.job is not None:
            ev.setdefault("job", self.job)
        self.events.write(dumps(ev) + "\n")
        self.events.flush()

    def backend(self, gm, example_inputs):
        from torch._dynamo.source import LocalSource
        from torch.fx.experimental.symbolic_shapes import free_symbols

        torch = self.torch
        dynamic, strides = {}, {}
        for node in gm.graph.nodes:
            if node.op != "placeholder":
                continue
            ga = node.meta.get("grapharg")
            src = getattr(ga, "source", None)
            if not isinstance(src, LocalSource):
                continue
            name = src.local_name
            ev = node.meta.get("example_value")
            if getattr(ga, "pass_arg_as_tensor", False):
                # A float compiled symbolically: Dynamo passes it as a 0-dim
                # float64 tensor (wrap_symfloat); a specialised float is a
                # constant, not a placeholder.
                dynamic[name] = "scalar"
            elif isinstance(ev, torch.Tensor):
                dims = [i for i, d in enumerate(ev.size()) if free_symbols(d)]
                if dims:
                    dynamic[name] = dims
                else:
                    sd = [i for i, d in enumerate(ev.stride()) if free_symbols(d)]
                    if sd:
                        strides[name] = sd
            elif isinstance(ev, torch.SymInt) and free_symbols(ev):
                dynamic[name] = "scalar"
        if self.detail:
            self.emit(ev="compile", step=self.step, dynamic=dynamic, dynamic_strides=strides,
                      graph=gm.code)
        else:
            self.emit(ev="compile", step=self.step, dynamic=dynamic, dynamic_strides=strides)
        return gm.forward

    def step_detail(self, fn) -> None:
        """(--detail) What a step left: the guards of each of ``fn``'s cache
        entries (Dynamo's guard tree, newest first, ids masked) and the code
        state Dynamo wrote for ``fn`` (every field of each source's entry)."""
        import torch._dynamo.pgo as pgo
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        guards = [mask_ids(str(e.guard_manager)) for e in _debug_get_cache_entry_list(fn.__code__)]
        code_state = {}
        for code_id, state in (pgo._CODE_STATE or {}).items():
            if code_id.filename != fn.__code__.co_filename:
                continue
            for name, entry in state.automatic_dynamic.items():
                code_state[name] = {f.name: repr(getattr(entry, f.name))
                                    for f in dataclasses.fields(entry)}
        self.emit(ev="step_detail", step=self.step, guards=guards, code_state=code_state)

    def make_program(self, sources):
        params = ", ".join(sources)
        lines = [f"def ccol_scenario({params}):", "    _ccol_out = _ccol_torch.zeros(())"]
        for s in sources:
            lines += [
                f"    if _ccol_isinstance({s}, _ccol_torch.Tensor):",
                f"        _ccol_out = _ccol_out + {s}.sum()",
                f"    elif _ccol_isinstance({s}, bool):",
                f"        if {s}:",
                "            _ccol_out = _ccol_out + 1",
                "        else:",
                "            _ccol_out = _ccol_out - 1",
                f"    elif _ccol_isinstance({s}, float):",
                f"        _ccol_out = _ccol_out * {s}",
                f"    elif {s} is not None:",
                f"        _ccol_out = _ccol_out + _ccol_torch.ones({s}).sum()",
            ]
        lines.append("    return _ccol_out")
        scope = {"_ccol_torch": self.torch, "_ccol_isinstance": isinstance}
        # A fresh code object per job (Dynamo keys its state by code).
        code = compile("\n".join(lines) + "\n", f"<ccol-scenario-{self.job}>", "exec")
        exec(code, scope)  # noqa: S102
        return scope["ccol_scenario"]

    def make_input(self, inp):
        torch = self.torch
        if inp is None:
            return None
        if "int" in inp:
            return inp["int"]
        if "bool" in inp:
            return inp["bool"]
        if "float" in inp:
            return float(inp["float"])
        size = inp["size"]
        stride = inp["stride"]
        if stride is None:
            return torch.zeros(size)
        return torch.empty_strided(size, stride).zero_()

    def run_job(self, job: dict) -> None:
        torch = self.torch
        import torch._dynamo

        sc = job["scenario"]
        collectives, votes = MODE_FLAGS[job["mode"]]
        package = self.package if (collectives or votes) else None
        torch._dynamo.reset()
        torch._dynamo.config.recompile_limit = sc["options"]["recompile_limit"]
        self.exchanges = 0
        self.job = job["id"]
        self.step = None
        self.detail = bool(job.get("detail"))
        self.torch_calls = {}
        from torch._dynamo.utils import counters

        counters.pop("compiler_collectives", None)
        error = None
        try:
            torch._dynamo.config.automatic_dynamic_shapes = sc["options"]["automatic_dynamic_shapes"]
            guard = sc["options"]["automatic_dynamic_exclusion_guard"]
            if hasattr(torch._dynamo.config, "automatic_dynamic_exclusion_guard"):
                torch._dynamo.config.automatic_dynamic_exclusion_guard = guard
            elif guard:
                raise RuntimeError(
                    f"harness: torch {torch.__version__} has no "
                    "torch._dynamo.config.automatic_dynamic_exclusion_guard (2.12 on)"
                )
            if package is not None:
                # Our exchange: the package's channel, its deadline the
                # harness's hang timeout, every compile exchanged as
                # PyTorch's own exchange does (exchange="always"). enable()
                # turns the collectives flag on; the mode then sets it.
                package.enable(timeout=job["timeout"], guard_votes=votes, exchange="always")
            torch._dynamo.config.enable_compiler_collectives = collectives
            if package is None:
                torch.compiler.set_enable_guard_collectives(votes)
            fn = self.make_program(sc["sources"])
            compiled = torch.compile(fn, backend=self.backend)
            self.dist.barrier()
            self.in_steps = True
            for s, step in enumerate(sc["steps"]):
                self.step = s
                inputs = step[self.rank]
                args = [self.make_input(inputs.get(src)) for src in sc["sources"]]
                compiled(*args)
                if self.detail:
                    self.step_detail(fn)
        except Exception as e:  # noqa: BLE001 - reported to the parent
            traceback.print_exc()
            error = self.error_of(e)
        finally:
            self.in_steps = False
            if package is not None:
                package.disable()
            else:
                torch.compiler.set_enable_guard_collectives(False)
        if error is None and self.exchange == "package":
            error = self.torch_group_use()
        restarts = dict(counters.get("compiler_collectives", {}))
        self.emit(ev="done", error=error, restart_skipped=restarts.get("restart_skipped", 0),
                  restarted=restarts.get("restarted", 0))
        self.job = None

    def error_of(self, e: Exception) -> dict:
        if self.package is not None:
            import compiler_collectives

            if isinstance(e, compiler_collectives.Error):
                # The package's channel begins with enable()'s check
                # (exchange #0): a compile or vote exchange k of the job is
                # the channel's exchange k + 1.
                exchange = None if e.exchange is None else e.exchange - 1
                return {
                    "kind": e.kind,
                    "missing_ranks": e.missing_ranks,
                    "exchange": exchange,
                    "message": str(e)[:2000],
                }
        return {
            "kind": "exception",
            "missing_ranks": [],
            "exchange": None,
            "message": f"{type(e).__name__}: {e}"[:2000],
        }

    def torch_group_use(self):
        """An error when the package ran a torch collective or made a group."""
        from torch._dynamo import distributed as dd

        made = [n for n, g in (("_COMPILE_PG", dd._COMPILE_PG), ("_GUARD_PG", dd._GUARD_PG))
                if g is not None]
        if not self.torch_calls and not made:
            return None
        return {
            "kind": "torch_collective",
            "missing_ranks": [],
            "exchange": None,
            "message": (
                f"harness: with --exchange package, torch.distributed calls during the steps: "
                f"{self.torch_calls}; Dynamo groups created: {made}"
            ),
        }

    def serve(self) -> None:
        for line in sys.stdin:
            msg = json.loads(line)
            if msg["op"] == "exit":
                break
            if msg["op"] == "job":
                self.run_job(msg)
        try:
            self.dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


# --------------------------------------------------------------------------
# The parent: worlds of rank processes, jobs, deadlines
# --------------------------------------------------------------------------


class World:
    """world_size rank processes joined by one Gloo process group."""

    def __init__(self, world_size: int, start_timeout: float, pg_timeout: float,
                 exchange: str = "pytorch"):
        self.world_size = world_size
        self.dir = tempfile.mkdtemp(prefix="ccol-oracle-")
        self.events: queue.Queue = queue.Queue()
        self.procs = []
        env = dict(os.environ)
        if "GLOO_SOCKET_IFNAME" not in env and os.path.exists("/sys/class/net/lo"):
            env["GLOO_SOCKET_IFNAME"] = "lo"
        env.setdefault("OMP_NUM_THREADS", "1")
        store = os.path.join(self.dir, "store")
        for r in range(world_size):
            log = open(os.path.join(self.dir, f"rank{r}.log"), "w")
            p = subprocess.Popen(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--worker",
                    str(r),
                    str(world_size),
                    store,
                    str(pg_timeout),
                    exchange,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                text=True,
                start_new_session=True,
            )
            log.close()
            self.procs.append(p)
            threading.Thread(target=self._read, args=(r, p), daemon=True).start()
        ready = set()
        deadline = time.monotonic() + start_timeout
        while len(ready) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close(kill=True)
                raise RuntimeError(
                    f"harness: rank processes not ready after {start_timeout:.0f} s"
                )
            try:
                ev = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if ev.get("ev") == "ready":
                ready.add(ev["rank"])
            elif ev.get("ev") == "eof":
                text = self.log_tail(ev["rank"])
                self.close(kill=True)
                raise RuntimeError(f"harness: rank {ev['rank']} failed to start:\n{text}")

    def _read(self, rank: int, p) -> None:
        for line in p.stdout:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                pass
        self.events.put({"ev": "eof", "rank": rank})

    def log_tail(self, rank: int, n: int = 4000) -> str:
        try:
            with open(os.path.join(self.dir, f"rank{rank}.log")) as f:
                return f.read()[-n:]
        except OSError:
            return ""

    def send(self, msg: dict) -> None:
        for p in self.procs:
            try:
                p.stdin.write(dumps(msg) + "\n")
                p.stdin.flush()
            except (BrokenPipeError, OSError):
                pass

    def close(self, kill: bool = False) -> None:
        if not kill:
            self.send({"op": "exit"})
            end = time.monotonic() + 20
            for p in self.procs:
                try:
                    p.wait(timeout=max(0.1, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    kill = True
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class RankState:
    def __init__(self, rank: int):
        self.rank = rank
        self.compile_steps = []
        self.last = None
        self.graphs = []
        self.steps = []
        self.restarts = {}
        self.entered = 0
        self.waiting = None  # (seq, kind, step)
        self.done = False
        self.error = None


def run_job(world: World, job_id: int, sc: dict, mode: str, stall: float, deadline: float,
            detail: bool = False):
    """Runs one job; returns (output, healthy) where healthy says whether the
    world may run further jobs."""
    ranks = [RankState(r) for r in range(sc["world_size"])]
    world.send(
        {
            "op": "job",
            "id": job_id,
            "mode": mode,
            "timeout": stall,
            "detail": detail,
            "scenario": {
                "sources": sc["sources"],
                "steps": sc["steps"],
                "options": sc["options"],
            },
        }
    )
    start = last = time.monotonic()
    stuck = None
    while not all(r.done for r in ranks):
        try:
            ev = world.events.get(timeout=0.1)
        except queue.Empty:
            ev = None
        now = time.monotonic()
        if ev is not None and ev.get("job", job_id) == job_id:
            last = now
            r = ranks[ev["rank"]]
            kind = ev.get("ev")
            if kind == "enter":
                r.entered = ev["seq"] + 1
                r.waiting = (ev["seq"], ev["kind"], ev["step"])
            elif kind == "leave":
                r.waiting = None
            elif kind == "compile":
                r.compile_steps.append(ev["step"])
                r.last = ev
                if "graph" in ev:
                    r.graphs.append(ev["graph"])
            elif kind == "step_detail":
                r.steps.append({k: ev[k] for k in ("step", "guards", "code_state")})
            elif kind == "done":
                r.done = True
                r.error = ev.get("error")
                r.restarts = {k: ev.get(k, 0) for k in ("restart_skipped", "restarted")}
            elif kind == "eof":
                if not r.done:
                    r.done = True
                    r.error = {
                        "kind": "crash",
                        "missing_ranks": [],
                        "exchange": None,
                        "message": f"rank {r.rank} exited:\n" + world.log_tail(r.rank),
                    }
        blocked = all(r.done or r.waiting is not None for r in ranks)
        if blocked and now - last >= stall:
            stuck = f"no progress for {stall:g} s"
            break
        if now - start >= deadline:
            stuck = f"job deadline of {deadline:g} s"
            break
    healthy = stuck is None and all(r.error is None for r in ranks)
    if stuck is not None:
        for r in ranks:
            if r.done:
                continue
            if r.waiting is None:
                r.error = {
                    "kind": "timeout",
                    "missing_ranks": [],
                    "exchange": None,
                    "message": f"harness: rank {r.rank} still running ({stuck}), not in an exchange",
                }
                continue
            seq, kind, step = r.waiting
            missing = [q.rank for q in ranks if q.rank != r.rank and q.entered <= seq]
            others = [
                q.rank
                for q in ranks
                if q.rank != r.rank and q.waiting is not None and q.waiting[0] == seq
                and q.waiting[1] != kind
            ]
            if missing:
                finished = all(ranks[m].done for m in missing)
                err_kind = "peer_lost" if finished else "timeout"
                why = "had finished" if finished else "never arrived"
                message = (
                    f"harness: rank {r.rank} waited at exchange #{seq} ({kind}, step {step}) "
                    f"for rank(s) {missing}, which {why} ({stuck}); PyTorch itself waits "
                    "for the process group timeout"
                )
                r.error = {
                    "kind": err_kind,
                    "missing_ranks": missing,
                    "exchange": seq,
                    "message": message,
                }
            else:
                r.error = {
                    "kind": "desync",
                    "missing_ranks": [],
                    "exchange": None,
                    "message": (
                        f"harness: rank {r.rank} waited at exchange #{seq} ({kind}, step "
                        f"{step}) while rank(s) {others} waited at #{seq} in another "
                        f"exchange ({stuck})"
                    ),
                }
    out_ranks = []
    for r in ranks:
        obj = {
            "rank": r.rank,
            "compiles": len(r.compile_steps),
            "compile_steps": r.compile_steps,
            "dynamic": (r.last or {}).get("dynamic", {}),
            "dynamic_strides": (r.last or {}).get("dynamic_strides", {}),
        }
        if detail:
            obj["detail"] = {"graphs": r.graphs, "steps": r.steps, **r.restarts}
        if r.error is not None:
            obj["error"] = r.error
        out_ranks.append(obj)
    return {"name": sc["name"], "ranks": out_ranks}, healthy


def run_jobs(jobs, stall: float, deadline: float, start_timeout: float, exchange: str = "pytorch",
             detail: bool = False):
    """jobs: list of (scenario, mode). Yields (scenario, mode, status, output, reason)."""
    worlds: dict[int, World] = {}
    pg_timeout = max(deadline, stall) + 120
    try:
        for i, (sc, mode) in enumerate(jobs):
            reason = unsupported_reason(sc)
            if reason is not None:
                yield sc, mode, "unsupported", None, reason
                continue
            ws = sc["world_size"]
            if ws not in worlds:
                # One world at a time keeps the machine's cores for the job.
                for w in list(worlds.values()):
                    w.close()
                worlds.clear()
                worlds[ws] = World(ws, start_timeout, pg_timeout, exchange)
            world = worlds[ws]
            output, healthy = run_job(world, i, sc, mode, stall, deadline, detail)
            if not healthy:
                world.close(kill=True)
                del worlds[ws]
            failed = any("error" in r for r in output["ranks"])
            yield sc, mode, ("failed" if failed else "ok"), output, None
    finally:
        for w in worlds.values():
            w.close()


def write_detail(root: str, exchange: str, sc: dict, mode: str, status: str, output) -> None:
    """Writes a job's recorded detail to ``root/<exchange>/<file>.<mode>.json``
    and takes it out of ``output`` (whose shape stays ``ccol scenario
    run``'s)."""
    ranks = []
    for r in (output or {}).get("ranks", []):
        ranks.append({"rank": r["rank"], "compile_steps": r["compile_steps"],
                      "failed": "error" in r, **r.pop("detail", {})})
    folder = os.path.join(root, exchange)
    os.makedirs(folder, exist_ok=True)
    name = os.path.basename(sc["file"]).removesuffix(".json")
    with open(os.path.join(folder, f"{name}.{mode}.json"), "w") as f:
        f.write(dumps({"file": sc["file"], "mode": mode, "status": status,
                       "options": sc["options"], "ranks": ranks}))


#: The fields of a code-state entry that only the exclusion guard reads
#: (``automatic_dynamic_exclusion_guard``). Where it is off, the package
#: hands Dynamo the join of every rank's state, whose fold leaves them as a
#: fold of one state does (docs/python.md, "Which states Dynamo folds");
#: they are compared only where it is on.
EXCLUSION_FIELDS = ("excluded_sizes", "excluded_scalar")


def compare_detail(root: str) -> int:
    """Compares the package's recorded jobs (``root/package``) with PyTorch's
    (``root/pytorch``): for every job both finished, each rank's compile
    steps, FX graph code, and after each step its guards and the code state
    Dynamo wrote. Prints each difference and a summary line (JSON:
    compared, differ, the package's restart_skipped and restarted); exits 0
    when nothing differs and something was compared, else 1."""
    theirs_dir, ours_dir = os.path.join(root, "pytorch"), os.path.join(root, "package")
    compared, differ, skipped, restarted = 0, [], 0, 0
    for name in sorted(os.listdir(ours_dir)):
        with open(os.path.join(ours_dir, name)) as f:
            ours = json.load(f)
        try:
            with open(os.path.join(theirs_dir, name)) as f:
                theirs = json.load(f)
        except FileNotFoundError:
            continue
        if theirs["status"] != "ok":
            continue
        if ours["status"] != "ok":
            differ.append(f"{name}: PyTorch finished, the package's run {ours['status']}")
            continue
        compared += 1
        guard = ours["options"].get("automatic_dynamic_exclusion_guard")
        for a, b in zip(ours["ranks"], theirs["ranks"]):
            skipped += a.get("restart_skipped", 0)
            restarted += a.get("restarted", 0)
            for part in ("compile_steps", "graphs"):
                if a[part] != b[part]:
                    differ.append(f"{name} rank {a['rank']}: {part}: {a[part]!r} != {b[part]!r}")
            if len(a["steps"]) != len(b["steps"]):
                differ.append(f"{name} rank {a['rank']}: {len(a['steps'])} steps recorded, "
                              f"PyTorch {len(b['steps'])}")
            for x, y in zip(a["steps"], b["steps"]):
                if x["guards"] != y["guards"]:
                    differ.append(f"{name} rank {a['rank']} step {x['step']}: guards:\n"
                                  + "\n".join(x["guards"]) + "\n  PyTorch's:\n"
                                  + "\n".join(y["guards"]))
                cx, cy = x["code_state"], y["code_state"]
                if not guard:
                    cx, cy = ({n: {k: v for k, v in e.items() if k not in EXCLUSION_FIELDS}
                               for n, e in c.items()} for c in (cx, cy))
                if cx != cy:
                    differ.append(f"{name} rank {a['rank']} step {x['step']}: code state "
                                  f"{cx!r} != PyTorch's {cy!r}")
    for line in differ:
        print(f"DIFF {line}")
    print(dumps({"compared": compared, "differ": len(differ), "restart_skipped": skipped,
                 "restarted": restarted}), flush=True)
    return 0 if compared and not differ else 1


def default_timeout() -> float:
    v = os.environ.get("CCOL_TIMEOUT_S")
    if v:
        try:
            return float(v)
        except ValueError:
            pass
    return 10.0


def main(argv) -> int:
    if argv and argv[0] == "--worker":
        rank, ws, store, pg_timeout = int(argv[1]), int(argv[2]), argv[3], float(argv[4])
        exchange = argv[5] if len(argv) > 5 else "pytorch"
        Worker(rank, ws, store, pg_timeout, exchange).serve()
        return 0
    if argv and argv[0] == "--compare-detail":
        if len(argv) != 2:
            print("usage: harness.py --compare-detail DIR", file=sys.stderr)
            return EXIT_MALFORMED
        return compare_detail(argv[1])
    ap = argparse.ArgumentParser(
        description="Run scenario files on real PyTorch Dynamo (the PyTorch oracle)."
    )
    ap.add_argument("files", nargs="+", metavar="FILE")
    ap.add_argument("--batch", action="store_true", help="one JSON line per (file, mode) job")
    ap.add_argument(
        "--detail-dir",
        default=os.environ.get("CCOL_ORACLE_DETAIL_DIR") or None,
        help="(--batch) also record every compile's FX graph code, each step's guards (ids "
        "masked) and code state, and the package's restart counts, one file per job under "
        "DIR/<exchange>/ (default CCOL_ORACLE_DETAIL_DIR); compare two with --compare-detail DIR",
    )
    ap.add_argument(
        "--finishing",
        action="store_true",
        help="(--batch) only the (file, mode) jobs whose expectation has no rank failing",
    )
    ap.add_argument("--mode", action="append", choices=MODES, help="(--batch) modes to run")
    ap.add_argument("--collectives", dest="collectives", action="store_true", default=None)
    ap.add_argument("--no-collectives", dest="collectives", action="store_false")
    ap.add_argument("--guard-collectives", dest="votes", action="store_true", default=None)
    ap.add_argument("--no-guard-collectives", dest="votes", action="store_false")
    ap.add_argument("--json", action="store_true", help="accepted for parity with ccol")
    ap.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds without progress, every rank finished or in an exchange, "
        "after which the job counts as hung (default CCOL_TIMEOUT_S, else 10)",
    )
    ap.add_argument("--deadline", type=float, default=300.0, help="seconds per job")
    ap.add_argument(
        "--exchange",
        choices=["pytorch", "package"],
        default="pytorch",
        help="whose exchange runs in the collective modes: PyTorch's own (with the CPU "
        "device patch; default) or the compiler_collectives package (no patch)",
    )
    ap.add_argument("--start-timeout", type=float, default=300.0)
    a = ap.parse_args(argv)
    stall = a.timeout if a.timeout is not None else default_timeout()
    if not a.batch and len(a.files) != 1:
        ap.error("give one FILE, or --batch")
    jobs = []
    bad = False
    for f in a.files:
        try:
            sc = load_scenario(f)
        except Malformed as e:
            if not a.batch:
                print(f"harness: {e}", file=sys.stderr)
                return EXIT_MALFORMED
            print(dumps({"file": f, "name": None, "mode": None, "status": "malformed",
                         "output": None, "reason": str(e)}), flush=True)
            bad = True
            continue
        if a.batch:
            modes = a.mode or [m for m in MODES if m in sc["expect"]]
            if not modes:
                modes = [mode_of(sc["options"]["collectives"], sc["options"]["guard_collectives"])]
            if a.finishing:
                modes = [m for m in modes if m in sc["expect"] and not any(
                    "error" in r for r in sc["expect"][m].get("ranks", []))]
        else:
            c = sc["options"]["collectives"] if a.collectives is None else a.collectives
            v = sc["options"]["guard_collectives"] if a.votes is None else a.votes
            modes = [mode_of(c, v)]
        jobs += [(sc, m) for m in modes]
    code = EXIT_MALFORMED if bad else EXIT_OK
    detail = a.batch and a.detail_dir is not None
    for sc, mode, status, output, reason in run_jobs(jobs, stall, a.deadline, a.start_timeout,
                                                     a.exchange, detail):
        if detail:
            write_detail(a.detail_dir, a.exchange, sc, mode, status, output)
        if a.batch:
            print(dumps({"file": sc["file"], "name": sc["name"], "mode": mode,
                         "status": status, "output": output, "reason": reason}), flush=True)
            continue
        if status == "unsupported":
            print(f"harness: PyTorch cannot express this scenario: {reason}", file=sys.stderr)
            return EXIT_UNSUPPORTED
        print(dumps(output), flush=True)
        return EXIT_RANK_FAILED if status == "failed" else EXIT_OK
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
