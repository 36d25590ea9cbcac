"""What ``enable`` checks before it changes anything: the installed torch
against the version table, the agreements' switches, the deadline, the
group, and the settings every rank of a group must share (the text of the
check exchange #0, ``torch.enable``)."""

from __future__ import annotations

import datetime
import logging
import math
import os
import sys
from typing import Optional, Union

import torch
import torch.distributed as dist

from . import _cache_vote, _compat, _decide
from ._errors import IncompatibleTorch, InvalidArgument, Unsupported

log = logging.getLogger("compiler_collectives.torch")

#: The default deadline of the rendezvous and of every exchange (seconds),
#: when neither ``timeout`` nor ``CCOL_TIMEOUT_S`` gives one.
DEFAULT_TIMEOUT_S = 300.0


def resolve(path: str):
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = __import__(".".join(parts[:i]), fromlist=["_"])
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


#: Modules whose agreements are installed when torch imports them
#: (``_lazy``): importing them costs more than the rest of ``enable``, and a
#: job that compiles with ``aot_eager`` or ``eager`` never does. The live
#: checks of their entries wait for that import too (:func:`check_live`).
DEFERRED_MODULES = ("torch._inductor.distributed_autotune", "torch._functorch.partitioners")


def _deferred(path: str) -> bool:
    return any(path.startswith(m + ".") for m in DEFERRED_MODULES) and not any(
        path.startswith(m + ".") and m in sys.modules for m in DEFERRED_MODULES
    )


def check_live(paths) -> None:
    """The live checks of the table entries `paths` that ``check_torch``
    deferred (their module was not imported then): raises
    ``IncompatibleTorch`` naming each entry whose live object is not what
    the sources said (replaced at run time, not callable as the package
    calls it)."""
    table = _compat.load_table()
    root = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))
    observed, sites = _compat.observe_cached(root, table["entries"])
    problems = {}
    for path in paths:
        if observed.get(path) is not None:
            why = _compat.live_problem(root, path, table["entries"][path],
                                       known=observed[path] is True, site=sites.get(path))
            if why is not None:
                problems[path] = why
    if problems:
        raise IncompatibleTorch(
            "compiler_collectives.torch: what it replaces in torch changed after enable() "
            "checked it: " + "; ".join(f"{p} ({why})" for p, why in sorted(problems.items()))
        )


def check_torch(allow_untested: bool = False) -> "_decide.Decision":
    """Which tested torch this one is (every table entry equal to that
    version's), read from the installed torch's source and its live objects
    (those of :data:`DEFERRED_MODULES` only where already imported: the
    rest when torch imports them, :func:`check_live`).

    Raises IncompatibleTorch naming the version and each entry that differs
    from the nearest tested version; with ``allow_untested``, logs one
    warning instead and follows that version, unless a required entry is
    missing or cannot be called as this module calls it. Changes nothing."""
    try:
        table = _compat.load_table()
    except (OSError, ValueError) as e:
        raise IncompatibleTorch(
            f"compiler_collectives.torch cannot read its torch table {_compat.table_path()}: "
            f"{e}. Nothing was changed."
        ) from None
    root = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))
    observed, sites = _compat.observe_cached(root, table["entries"])
    problems = {}
    for path, entry in table["entries"].items():
        if observed[path] is not None and not _deferred(path):
            why = _compat.live_problem(root, path, entry, known=observed[path] is True,
                                       site=sites.get(path))
            if why is not None:
                problems[path] = why
    try:
        decision = _decide.decide(table, observed, problems, torch.__version__, allow_untested)
    except _decide.Refusal as e:
        raise IncompatibleTorch(str(e)) from None
    if decision.warning is not None:
        log.warning("%s", decision.warning)
    return decision


#: The table entries each agreement replaces or wraps: an agreement is
#: installed when the followed torch version has every entry of its list.
AGREEMENT_ENTRIES = {
    "cache_vote_before_2_15": [
        "torch._functorch._aot_autograd.autograd_cache.AOTAutogradCache.try_load",
        "torch._functorch._aot_autograd.autograd_cache.AOTAutogradCache._lookup",
    ],
    "cache_vote_2_15": [_cache_vote.SYNC_PATH],
    "partitioner": [
        "torch._functorch.partitioners._sync_decision_cross_ranks",
        "torch._functorch.partitioners._canonical_node_names",
        "torch._functorch.partitioners._size_of",
    ],
    "autotune": [
        "torch._inductor.distributed_autotune.get_autotune_pg",
        "torch._inductor.distributed_autotune._sync",
        "torch._inductor.distributed_autotune.maybe_autotune_remote",
        "torch._inductor.distributed_autotune._SerializedChoice",
    ],
    "graph_check": ["torch._dynamo.output_graph.OutputGraph.call_user_compiler"],
    "compile_once": [
        "torch._functorch._aot_autograd.autograd_cache.AOTAutogradCache.try_load",
        "torch._functorch._aot_autograd.autograd_cache.AOTAutogradCache._lookup",
        "torch._functorch._aot_autograd.autograd_cache.AOTAutogradCache.save",
        "torch._functorch._aot_autograd.autograd_cache.AOTAutogradCache._get_tmp_dir_for_key",
        "torch._inductor.codecache.FxGraphCache._lookup_graph",
        "torch._inductor.codecache.FxGraphCache._save_graph",
        "torch._inductor.codecache.FxGraphCache._get_tmp_dir_for_key",
        "torch._inductor.codecache.CppCodeCache._load_library",
        "torch._inductor.codecache.get_lock_dir",
        "torch._inductor.codecache.LOCK_TIMEOUT",
        "torch.utils._filelock.FileLock",
        "torch._inductor.runtime.cache_dir_utils.cache_dir",
        "torch._functorch.aot_autograd.aot_stage2_compile",
        "torch._functorch.config.force_non_lazy_backward_lowering",
    ],
    "shard_kernels": [
        "torch._inductor.async_compile.AsyncCompile.submit",
        "torch._inductor.async_compile.AsyncCompile.wait",
        "torch._inductor.async_compile.get_compile_threads",
        "torch._inductor.codecache._worker_compile_cpp",
        "torch._inductor.codecache.CppCodeCache.load_async",
        "torch._inductor.async_compile.AsyncCompile.triton",
        "torch._inductor.async_compile.CompiledTritonKernels.get",
        "torch._inductor.runtime.cache_dir_utils.triton_cache_dir",
        "torch._inductor.codecache.CodeCacheFuture",
        "torch._inductor.codegen.triton.TritonScheduling._emit_kernel_to_wrapper",
    ],
    "spmd_check": [
        "torch._inductor.fx_passes.spmd_check.spmd_check",
        "torch._inductor.fx_passes.spmd_check._compute_hash",
        "torch._inductor.fx_passes.spmd_check._build_diag_fingerprint",
        "torch._inductor.fx_passes.spmd_check._build_mismatch_report",
    ],
}


def available(version: str) -> set:
    """The agreements of ``AGREEMENT_ENTRIES`` torch ``version`` (a table
    version) has every entry of."""
    known = _compat.load_table()["versions"][version]
    return {name for name, paths in AGREEMENT_ENTRIES.items() if all(known.get(p) for p in paths)}


def check_agreements(cache_agreement: bool, check_graphs: bool, available: set,
                     compile_once: bool = False) -> None:
    """What ``enable`` refuses about the agreements (nothing changed yet)."""
    for name, value in (("cache_agreement", cache_agreement), ("check_graphs", check_graphs)):
        if not isinstance(value, bool):
            raise InvalidArgument(f"{name} must be a bool, not {value!r}")
    if cache_agreement and not available & {"cache_vote_before_2_15", "cache_vote_2_15"}:
        raise Unsupported(
            f"cache_agreement=True: torch {torch.__version__} lacks the AOTAutogradCache "
            "functions it hooks into (see the version table). Nothing was changed."
        )
    if check_graphs and "graph_check" not in available:
        raise Unsupported(
            f"check_graphs=True: torch {torch.__version__} lacks "
            "OutputGraph.call_user_compiler. Nothing was changed."
        )
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    for flag, needs in (("_sync_decision_cross_ranks", {"partitioner"}),
                        (_cache_vote.TORCH_FLAG, {"cache_vote_2_15"})):
        if getattr(functorch_config, flag, False) and not available & needs:
            raise Unsupported(
                f"torch._functorch.config.{flag} is on, and torch {torch.__version__} lacks "
                "what the package runs that sync through (see the version table): its "
                "collectives would run on a torch process group, outside this package's "
                "channel and deadline. Turn it off. Nothing was changed."
            )

    optimizations = getattr(inductor_config, "aten_distributed_optimizations", None)
    if getattr(optimizations, "spmd_check", False) and not (cache_agreement or compile_once):
        raise Unsupported(
            "torch._inductor.config.aten_distributed_optimizations.spmd_check is on: its check "
            "runs after AOTAutograd's cache lookup, which a rank that hit its cache never "
            "passes, so the ranks that compile would wait on the others. Pass "
            "cache_agreement=True (every rank then compiles, or none) or compile_once=True "
            "(one rank compiles each graph, and checks it alone), or turn it off. "
            "Nothing was changed."
        )


#: Inductor passes that call ``dist.get_rank()`` after the cache key is
#: computed (pytorch/pytorch issue 188332): a graph they compiled holds one
#: rank's code under a key every rank shares. ``compile_once`` refuses them
#: on (the value that turns each off).
RANK_BAKING_PASSES = (
    ("torch._inductor.config.bucket_all_gathers_fx", "none"),
    ("torch._inductor.config.bucket_reduce_scatters_fx", "none"),
    ("torch._inductor.config.aten_distributed_optimizations.enable_overlap_scheduling", False),
)


def check_compile_once(compile_once: bool, max_artifact_bytes: int, available: set,
                       version: str) -> None:
    """What ``enable`` refuses about ``compile_once`` (nothing changed yet):
    a non-bool, a ``max_artifact_bytes`` that is not a positive int, a torch
    that lacks a function it hooks into (``Unsupported`` naming it), a pass
    of :data:`RANK_BAKING_PASSES` on."""
    if not isinstance(compile_once, bool):
        raise InvalidArgument(f"compile_once must be a bool, not {compile_once!r}")
    if (not isinstance(max_artifact_bytes, int) or isinstance(max_artifact_bytes, bool)
            or max_artifact_bytes <= 0):
        raise InvalidArgument(
            f"max_artifact_bytes must be a positive int (bytes), not {max_artifact_bytes!r}")
    if not compile_once:
        return
    _require("compile_once", available, version)
    on = []
    for path, off in RANK_BAKING_PASSES:
        module, name = path.rsplit(".", 1)
        try:
            value = getattr(resolve(module), name, off)
        except (ImportError, AttributeError):
            continue
        if value != off:
            on.append(f"{path}={value!r}")
    if on:
        raise Unsupported(
            "compile_once=True: " + ", ".join(on) + " calls dist.get_rank() after the cache key "
            "is computed, so a graph one rank compiled would run another rank's code on every "
            "rank. Turn it off, or leave compile_once off. Nothing was changed.")


def warn_about_cache_skew(cache_agreement: bool) -> None:
    """The partitioner's sync with AOTAutograd's cache on and no cache-hit
    agreement: a rank that hits skips the sync, and the others' exchange
    fails (a Desync or Timeout naming it, not a hang)."""
    import torch._functorch.config as functorch_config

    if not getattr(functorch_config, "_sync_decision_cross_ranks", False):
        return
    if cache_agreement or getattr(functorch_config, _cache_vote.TORCH_FLAG, False):
        return
    if getattr(torch.compiler.config, "force_disable_caches", False):
        return
    if functorch_config.enable_autograd_cache or getattr(
        functorch_config, "enable_remote_autograd_cache", False
    ):
        log.warning(
            "torch._functorch.config._sync_decision_cross_ranks is on with AOTAutograd's "
            "cache and no cache-hit agreement: a rank whose cache hits skips the "
            "partitioner's exchanges, and the others then fail with a Desync or Timeout "
            "naming it. enable(cache_agreement=True) keeps the ranks together."
        )


def warn_about_fx_cache_skew() -> None:
    """Inductor's SPMD check with Inductor's FX graph cache on: a rank whose
    FX graph cache hits skips the post-grad passes, hence the check, even
    where the AOTAutograd cache vote made it compile; the others' check then
    fails (a Timeout naming it, not a hang); measured on torch 2.15.0
    (docs/python.md, "Every agreement")."""
    from torch._inductor import config as inductor_config

    if not getattr(inductor_config.aten_distributed_optimizations, "spmd_check", False):
        return
    if getattr(torch.compiler.config, "force_disable_caches", False):
        return
    if inductor_config.fx_graph_cache or inductor_config.fx_graph_remote_cache:
        log.warning(
            "torch._inductor.config.aten_distributed_optimizations.spmd_check is on with "
            "Inductor's FX graph cache: a rank whose FX graph cache hits skips the post-grad "
            "passes and so the SPMD check (cache_agreement=True votes on AOTAutograd's cache "
            "only), and the others then fail with a Timeout naming it. Turn "
            "torch._inductor.config.fx_graph_cache off, or keep every rank's Inductor cache "
            "in the same state."
        )


#: torch's switches that an agreement depends on (what ``enable`` checks
#: and installs follows their values then): read again at each compile, and
#: one changed after ``enable`` is refused there (:func:`check_switches`).
AGREEMENT_SWITCHES = (
    "torch._functorch.config._sync_decision_cross_ranks",
    "torch._functorch.config._sync_cache_decision_cross_ranks",
    "torch._inductor.config.distributed_max_autotune_gemm",
    "torch._inductor.config.aten_distributed_optimizations.spmd_check",
)


def switches() -> dict:
    """The values of :data:`AGREEMENT_SWITCHES` now (None where this torch
    has none)."""
    out = {}
    for path in AGREEMENT_SWITCHES:
        module, name = path.rsplit(".", 1)
        try:
            out[path] = getattr(resolve(module), name, None)
        except (ImportError, AttributeError):
            out[path] = None
    return out


def check_switches(at_enable: dict) -> None:
    """Raises ``InvalidArgument`` naming each switch of
    :data:`AGREEMENT_SWITCHES` whose value differs from `at_enable`."""
    now = switches()
    changed = [f"{p} ({at_enable[p]!r} at enable(), {now[p]!r} now)"
               for p in AGREEMENT_SWITCHES if now[p] != at_enable.get(p)]
    if changed:
        raise InvalidArgument(
            "compiler_collectives.torch: a switch an agreement depends on changed after "
            f"enable(): {'; '.join(changed)}. Set it before compiler_collectives.torch.enable(), "
            "on every rank."
        )


def timeout_seconds(timeout: Union[None, float, int, datetime.timedelta]) -> float:
    if timeout is None:
        text = os.environ.get("CCOL_TIMEOUT_S", "")
        if not text:
            return DEFAULT_TIMEOUT_S
        from ._native import parse_timeout_secs

        # Core's parser, as every tool of the project reads the variable.
        try:
            value = parse_timeout_secs(text)
        except InvalidArgument as e:
            raise InvalidArgument(f"CCOL_TIMEOUT_S={text!r}: {e}") from None
        what = f"CCOL_TIMEOUT_S={text!r}"
    elif isinstance(timeout, datetime.timedelta):
        value, what = timeout.total_seconds(), f"timeout={timeout!r}"
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        value, what = float(timeout), f"timeout={timeout!r}"
    else:
        raise InvalidArgument(
            f"timeout must be seconds (a number) or a datetime.timedelta, not {timeout!r}"
        )
    if not (math.isfinite(value) and value > 0):
        raise InvalidArgument(f"{what}: the deadline must be a finite, positive number of seconds")
    if timeout is not None:
        from ._native import parse_timeout_secs

        # Core's rule, as for CCOL_TIMEOUT_S (at most ten years): a larger
        # deadline overflowed on its way to the store's and Gloo's waits.
        try:
            parse_timeout_secs(repr(value))
        except InvalidArgument as e:
            raise InvalidArgument(f"{what}: {e}") from None
    return value


def _require(feature: str, available: set, version: str) -> None:
    """``Unsupported`` naming what ``feature=True`` hooks into and the
    installed torch (following `version` of the table) lacks."""
    if feature in available:
        return
    known = _compat.load_table()["versions"][version]
    missing = [p for p in AGREEMENT_ENTRIES[feature] if not known.get(p)]
    raise Unsupported(
        f"{feature}=True: torch {torch.__version__} (following {version} of the version "
        f"table) lacks what it hooks into: {', '.join(missing)}. Nothing was changed.")


def check_shard_kernels(shard_kernels: bool, compile_once: bool, available: set,
                        version: str) -> Optional[int]:
    """What ``enable`` refuses about ``shard_kernels`` (nothing changed
    yet): a non-bool, on without ``compile_once``, a torch without the
    seams it hooks, Inductor's ``compile_threads`` below 2 (a rank that
    builds each kernel as its module is imported never holds a build).
    Returns ``compile_threads`` where sharding is on (it must agree)."""
    if not isinstance(shard_kernels, bool):
        raise InvalidArgument(f"shard_kernels must be a bool, not {shard_kernels!r}")
    if not shard_kernels:
        return None
    if compile_once is not True:
        raise InvalidArgument("shard_kernels=True needs compile_once=True (it changes who lowers "
                              "the graphs compile_once shares)")
    _require("shard_kernels", available, version)
    from torch._inductor.async_compile import get_compile_threads

    threads = get_compile_threads()
    if threads < 2:
        raise Unsupported(
            f"shard_kernels=True: Inductor's compile_threads is {threads} on this rank: it builds "
            "each kernel as the graph's module is imported, so no build can be shared. Set "
            "TORCHINDUCTOR_COMPILE_THREADS (or torch._inductor.config.compile_threads) to 2 or "
            "more on every rank. Nothing was changed.")
    return threads


def compile_timeout_seconds(value) -> float:
    """``enable(compile_timeout=...)`` (not None) as seconds: a finite,
    positive number within core's bound (``InvalidArgument`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, datetime.timedelta)):
        raise InvalidArgument(f"compile_timeout must be None or seconds, not {value!r}")
    try:
        return timeout_seconds(value)
    except InvalidArgument as e:
        raise InvalidArgument(f"compile_timeout: {e}") from None


#: Settings that shape automatic-dynamic, recompile and graph decisions: must
#: be equal on every rank. Each is a list of where torch versions keep it,
#: first choice first: the value is read from the first place the followed
#: version's table entry has (``compile_on_one_rank`` is in
#: ``torch.distributed.config`` up to 2.13, ``torch.compiler.config`` from
#: 2.14, where the former is a deprecated alias). Every place is a table entry.
CONFIG = [
    ["torch._dynamo.config.automatic_dynamic_shapes"],
    ["torch._dynamo.config.automatic_dynamic_shapes_mark_as"],
    ["torch._dynamo.config.assume_static_by_default"],
    ["torch._dynamo.config.specialize_int"],
    ["torch._dynamo.config.specialize_float"],
    ["torch._dynamo.config.force_parameter_static_shapes"],
    ["torch._dynamo.config.force_nn_module_property_static_shapes"],
    ["torch._dynamo.config.allow_unspec_int_on_nn_module"],
    ["torch._dynamo.config.capture_scalar_outputs"],
    ["torch._dynamo.config.capture_dynamic_output_shape_ops"],
    ["torch._dynamo.config.recompile_limit"],
    ["torch._dynamo.config.accumulated_recompile_limit"],
    ["torch._dynamo.config.enable_compiler_collectives"],
    ["torch._dynamo.config.automatic_dynamic_exclusion_guard"],
    ["torch._dynamo.config.canonicalize_output_graph_node_order"],
    ["torch.fx.experimental._config.use_duck_shape"],
    ["torch.compiler.config.dynamic_sources"],
    ["torch.compiler.config.unbacked_sources"],
    ["torch.compiler.config.dynamic_values"],
    ["torch.compiler.config.static_sources"],
    ["torch.compiler.config.compile_on_one_rank", "torch.distributed.config.compile_on_one_rank"],
    ["torch._functorch.config._sync_decision_cross_ranks"],
    ["torch._functorch.config._sync_cache_decision_cross_ranks"],
    # The caches and agreements (2.15's config states the cache vote's
    # preconditions: every rank reaches try_load for the same compiles).
    ["torch._functorch.config.enable_autograd_cache"],
    ["torch._functorch.config.enable_remote_autograd_cache"],
    ["torch._functorch.config.bundled_autograd_cache"],
    ["torch._inductor.config.fx_graph_cache"],
    ["torch._inductor.config.fx_graph_remote_cache"],
    ["torch._inductor.config.autotune_remote_cache"],
    ["torch._inductor.config.distributed_max_autotune_gemm"],
    ["torch._inductor.config.aten_distributed_optimizations.spmd_check"],
    ["torch._inductor.config.aten_distributed_optimizations.spmd_mismatch"],
    ["torch.compiler.config.force_disable_caches"],
    ["torch._functorch.config.force_non_lazy_backward_lowering"],
    ["torch._inductor.config.bucket_all_gathers_fx"],
    ["torch._inductor.config.bucket_reduce_scatters_fx"],
    ["torch._inductor.config.aten_distributed_optimizations.enable_overlap_scheduling"],
    ["torch.compiler.config.cache_key_tag"],
]


def settings(version: str) -> list:
    """(path, value) of each CONFIG setting, read where torch `version` (a
    table version: the one followed) keeps it; value None where it has none."""
    known = _compat.load_table()["versions"][version]
    out = []
    for places in CONFIG:
        path = next((p for p in places if known.get(p)), None)
        if path is None:
            out.append((places[0], None))
            continue
        module, name = path.rsplit(".", 1)
        try:
            value = repr(getattr(resolve(module), name))
        except (ImportError, AttributeError):
            value = "<absent>"
        out.append((path, value))
    return out


def must_agree(guard_votes, allow_untested: bool, version: str,
               cache_agreement: bool = False, check_graphs: bool = False,
               exchange: str = "auto", compile_once: bool = False,
               max_artifact_bytes: int = 0, shard_kernels: bool = False,
               compile_threads: Optional[int] = None) -> str:
    from ._native import VERSION, WIRE_VERSION

    fields = [
        f"torch={torch.__version__}",
        f"torch_followed={version}",
        f"compiler_collectives={VERSION}",
        f"wire={WIRE_VERSION}",
        f"exchange={exchange}",
        f"guard_votes={guard_votes}",
        f"allow_untested_torch={allow_untested}",
        f"cache_agreement={cache_agreement}",
        f"check_graphs={check_graphs}",
        f"compile_once={compile_once}",
        f"max_artifact_bytes={max_artifact_bytes}",
        f"shard_kernels={shard_kernels}",
    ]
    if shard_kernels:
        # Per rank (environment, CPU count): only where sharding needs it.
        fields.append(f"torch._inductor.config.compile_threads={compile_threads}")
    for path, value in settings(version):
        fields.append(f"{path}={'<absent in torch ' + version + '>' if value is None else value}")
    return "\n".join(fields)



def group_ranks(group) -> list[int]:
    """The job ranks, ascending, of the ranks that compile the same program
    as this one: ``group`` as ``enable`` takes it (see there). Raises
    ``InvalidArgument`` for anything else, a rank out of the job or listed
    twice, or a group without this rank."""
    world = dist.get_world_size()
    if group is None:
        return list(range(world))
    what = repr(group)
    try:
        from torch.distributed.device_mesh import DeviceMesh
    except ImportError:  # a torch built without it
        DeviceMesh = ()
    if group is getattr(dist.GroupMember, "NON_GROUP_MEMBER", object()):
        raise InvalidArgument(
            f"rank {dist.get_rank()} is not a member of the ProcessGroup it passed to enable() "
            "(torch gives non-members GroupMember.NON_GROUP_MEMBER); every rank passes the "
            "group of ranks that compile the same program as itself"
        )
    if isinstance(group, dist.ProcessGroup):
        ranks = dist.get_process_group_ranks(group)
    elif DeviceMesh and isinstance(group, DeviceMesh):
        if group.ndim != 1:
            raise InvalidArgument(
                f"group: a DeviceMesh of {group.ndim} dimensions; pass (mesh, dim_name) "
                "for the dimension whose ranks compile the same program"
            )
        ranks = group.mesh.flatten().tolist()
    elif isinstance(group, tuple) and len(group) == 2 and DeviceMesh and isinstance(
        group[0], DeviceMesh
    ):
        mesh, dim = group
        if not isinstance(dim, str):
            raise InvalidArgument(
                f"group: (DeviceMesh, dim_name) takes the dimension by its name (a str), "
                f"not {dim!r} (the mesh's dimensions: {list(mesh.mesh_dim_names or ())})"
            )
        if dim not in (mesh.mesh_dim_names or ()):
            raise InvalidArgument(
                f"group: the DeviceMesh has no dimension {dim!r} "
                f"(its dimensions: {list(mesh.mesh_dim_names or ())})"
            )
        ranks = dist.get_process_group_ranks(mesh.get_group(dim))
    elif isinstance(group, (list, tuple, range)):
        ranks = list(group)
    else:
        raise InvalidArgument(
            "group must be None (the world), a torch ProcessGroup, a 1-D DeviceMesh, "
            f"(DeviceMesh, dim_name) or a list of job ranks, not {what}"
        )
    if not ranks or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        raise InvalidArgument(f"group: expected a non-empty list of job ranks (ints), got {what}")
    out = sorted(ranks)
    if any(a == b for a, b in zip(out, out[1:])):
        raise InvalidArgument(f"group: a rank is listed twice in {out}")
    if out[0] < 0 or out[-1] >= world:
        raise InvalidArgument(f"group: ranks {out} are not all in a job of {world} ranks")
    me = dist.get_rank()
    if me not in out:
        raise InvalidArgument(
            f"rank {me} is not in the group it passed to enable() ({out}); every rank passes "
            "the group of ranks that compile the same program as itself"
        )
    return out

