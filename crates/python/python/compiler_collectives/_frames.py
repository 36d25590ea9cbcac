"""Dynamo's compiler collective on the channel: the frame exchange that
replaces ``OutputGraph.run_compiler_collective``, its key, the compile group
stand-in ``get_compile_pg`` returns, and the "holds collectives" bit that
travels with each exchanged frame (``_policy``)."""

from __future__ import annotations

import copy
import hashlib
import logging

import torch

from . import _policy, _restart, _state, _votes
from ._errors import Error

log = logging.getLogger("compiler_collectives.torch")

#: Longest frame key sent (bytes); longer ones keep their start and a digest.
MAX_KEY = 1024


def frame_key(tx) -> str:
    """The compile key of a frame's exchange: portable across hosts (no file
    path) and distinct per compile of the frame."""
    code = tx.f_code
    module = tx.f_globals.get("__name__", "?") if hasattr(tx, "f_globals") else "?"
    qualname = getattr(code, "co_qualname", code.co_name)
    from torch._guards import CompileContext

    c = _policy.current()
    if c is not None and c.code is code:
        # The package's count of this code object's exchanged compiles: a
        # local compile on one rank never shifts the next exchange's key.
        count = c.index
    else:
        # A compile that began before enable().
        count = getattr(CompileContext.current_compile_id(), "frame_compile_id", None)
    wrapped = wrapped_names(tx) if module.startswith("torch.") else ""
    key = f"torch.frame {module}:{qualname}:{code.co_firstlineno}{wrapped}#{count}"
    if len(key.encode()) > MAX_KEY:
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        key = key.encode()[: MAX_KEY - 20].decode(errors="ignore") + f"…{digest}"
    return key


def wrapped_names(tx) -> str:
    """What a torch wrapper frame calls (``torch.compile(module)`` compiles
    ``external_utils.wrap_inline``'s ``inner`` for every module): the names
    of the classes or functions in its closure, ``[Linear]``, so that ranks
    compiling different modules do not share a key."""
    names = []
    for cell in getattr(tx, "closure", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        target = getattr(value, "__self__", value)
        if isinstance(target, torch.nn.Module) or not callable(target):
            names.append(type(target).__qualname__)
        else:
            names.append(getattr(target, "__qualname__", type(target).__qualname__))
    return f"[{','.join(names)}]" if names else ""


def joinable() -> bool:
    """Whether Dynamo's fold of every rank's state equals one fold of their
    join under this thread's settings (read where Dynamo reads them: in the
    compiling thread): automatic dynamic shapes on (off, the fold
    overwrites) and the exclusion guard off (on, the fold's
    ``excluded_sizes`` depend on the order and number of states). The rule:
    docs/python.md, "Which states Dynamo folds"."""
    config = torch._dynamo.config
    return bool(config.automatic_dynamic_shapes) and not getattr(
        config, "automatic_dynamic_exclusion_guard", False
    )


def collectives_on() -> bool:
    """Whether compile exchanges are on for a compile in this thread.

    Dynamo's settings are per thread in torch 2.13 (a user's value is a
    ``ContextVar``): what ``enable()`` set in its caller's thread reads as the
    default (off) in every other thread. A compile in another thread must
    exchange all the same, or ranks diverge: so the flag counts only where
    it was set in this thread (the way to turn exchanges off), and is on
    otherwise while the package is enabled."""
    try:
        from torch.utils._config_module import _UNSET_SENTINEL

        entry = torch._dynamo.config._config["enable_compiler_collectives"]
        value = entry.user_override.get()
    except (ImportError, AttributeError, KeyError, LookupError):
        return bool(torch._dynamo.config.enable_compiler_collectives)
    return True if value is _UNSET_SENTINEL else bool(value)


def get_compile_pg():
    """Replaces ``get_compile_pg``: this package's group for an exchanged
    compile (``_policy``), None for a local one (Dynamo then runs no
    compiler collective)."""
    st = _state.current
    if st is None or not collectives_on():
        return None
    c = _policy.current()
    exchanged = c.exchanged if c is not None else not _policy.in_local()
    return st.group if exchanged else None


#: The reserved source that carries the "holds collectives" bit in an
#: exchanged frame state: present (an int scalar 1) on a rank whose traced
#: graph holds collectives. The exchange's join keeps a source any rank
#: sent, so every rank sees it when any rank had it. Dynamo's source names
#: are never empty and never start with a control character; the
#: extension's own reserved sources are "" and names starting with U+0001.
HOLDS_COLLECTIVES = "\u0002compiler_collectives.holds_collectives"

#: The operator namespaces of collectives: c10d's ops, the functional
#: collectives (and their autograd forms) and symmetric memory.
_COLLECTIVE_NAMESPACES = frozenset(
    {"c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd", "symm_mem"}
)
#: Python modules whose functions, left in a graph as calls, are collectives.
_COLLECTIVE_MODULES = (
    "torch.distributed._functional_collectives",
    "torch.distributed.distributed_c10d",
    "torch.distributed._symmetric_memory",
)


def _is_collective(target) -> bool:
    name = None
    if isinstance(target, torch._ops.OpOverload):
        name = target.name()
    elif isinstance(target, torch._ops.OpOverloadPacket):
        name = getattr(target, "_qualified_op_name", None)
    if name is not None:
        return name.split("::", 1)[0] in _COLLECTIVE_NAMESPACES
    module = getattr(target, "__module__", None) or ""
    return module.startswith(_COLLECTIVE_MODULES)


def _is_wrapper_subclass(value) -> bool:
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if isinstance(value, (list, tuple)):
        return any(_is_wrapper_subclass(v) for v in value)
    return isinstance(value, torch.Tensor) and is_traceable_wrapper_subclass(value)


def holds_collectives(graph, submodule, depth: int = 0) -> bool:
    """Whether an FX graph holds collectives: a node that calls a c10d,
    functional-collective or symmetric-memory op (or a function of those
    modules), or whose ``example_value`` is a traceable wrapper subclass
    (DTensor); looking into the submodules that ``get_attr`` nodes name
    (higher-order ops' bodies), found by ``submodule(name)``."""
    for node in graph.nodes:
        if node.op in ("call_function", "call_method") and _is_collective(node.target):
            return True
        if _is_wrapper_subclass(node.meta.get("example_value")):
            return True
        if node.op == "get_attr" and depth < 16:
            sub = submodule(node.target)
            inner = getattr(sub, "graph", None)
            if isinstance(inner, torch.fx.Graph) and holds_collectives(
                inner, lambda name, sub=sub: getattr(sub, name, None), depth + 1
            ):
                return True
    return False


def _graph_holds_collectives(output_graph) -> bool:
    modules = getattr(output_graph, "nn_modules", None) or {}
    return holds_collectives(output_graph.graph, modules.get)


def _join_prior(tx, local_state) -> None:
    """Joins this rank's prior code-state entry into each source it sends
    (``exchange="auto"``, joinable frames): a local compile may have changed
    one rank's code state (``pgo._CODE_STATE``), and Dynamo folds the
    exchanged states into each rank's own prior entry; sending prior ⊔
    observation makes that fold the same on every rank (the prior is folded
    in again, which changes nothing: the fold is a join)."""
    import torch._dynamo.pgo as pgo

    state = pgo._CODE_STATE
    if not state:
        return
    code_id = _restart.code_id(tx)
    entries = state.get(code_id)
    if entries is None:
        return
    for name, observed in list(local_state.automatic_dynamic.items()):
        prior = entries.automatic_dynamic.get(name)
        if prior is None or prior == observed:
            continue
        joined = copy.copy(prior)
        joined |= observed
        local_state.automatic_dynamic[name] = joined


def make_run_compiler_collective(original):
    """Replaces ``OutputGraph.run_compiler_collective``: one exchange of the
    frame's ``LocalState`` on the channel (see the package docs), carrying
    the "holds collectives" bit; then Dynamo's restart."""
    from torch._dynamo import exc
    from torch._dynamo.pgo import FrameStateSizeEntry, auto_dynamic
    from torch._dynamo.utils import dynamo_timed

    def run_compiler_collective(self) -> None:
        tx = self.root_tx
        if tx is None:
            raise AssertionError("root_tx must not be None")
        ds = tx.distributed_state
        if ds is None or ds.all_states is not None:
            return
        st = _state.current
        if st is None or ds.compile_pg is not st.group:
            # A frame whose compile began before enable() (or after
            # disable()) with a group of Dynamo's own.
            return original(self)
        # Dynamo logs the same at INFO on its own logger.
        log.debug("compiler_collective %s", ds.local_state)
        torch._logging.trace_structured(
            "artifact",
            metadata_fn=lambda: {"name": "compiler_collective", "encoding": "string"},
            payload_fn=lambda: ds.local_state.render(),
        )
        join = joinable()
        sent = ds.local_state.automatic_dynamic
        # The entries the preflight used, before anything is joined in.
        observed = dict(sent)
        if st.exchange == "auto" and join:
            _join_prior(tx, ds.local_state)
        mine = _graph_holds_collectives(self)
        if mine:
            sent[HOLDS_COLLECTIVES] = FrameStateSizeEntry(
                scalar=1, size=auto_dynamic, stride=auto_dynamic
            )
        key = frame_key(tx)
        with dynamo_timed("compiler_collective", log_pt2_compile_event=True):
            try:
                ds.all_states = st.channel.exchange_local_state(key, ds.local_state, join)
            except Error as e:
                st.pending = e
                raise
            finally:
                sent.pop(HOLDS_COLLECTIVES, None)
        theirs = [s.automatic_dynamic.pop(HOLDS_COLLECTIVES, None) for s in ds.all_states]
        if mine or any(bit is not None for bit in theirs):
            _votes.graph_holds_collectives(st, key)
        if _restart.after_exchange(st, tx, observed, ds.all_states, key):
            return
        # As Dynamo does: tracing may diverge with what the exchange said.
        tx.speculation_log.clear()
        raise exc.CompileCollectiveRestartAnalysis

    run_compiler_collective.__wrapped__ = original
    return run_compiler_collective
