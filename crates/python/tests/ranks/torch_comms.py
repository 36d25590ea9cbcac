"""Counts torch process-group creations and collectives on torch groups made
while Dynamo compiles (``convert_frame._compile``) or AOTAutograd compiles a
backward lazily (``_AutogradBackwardCompiler.get_or_compile``): the compile
time exchanges that the package puts on its own channel. The training step's
own collectives (DDP's, FSDP's, a graph's functional collectives at run
time) are outside both and not counted.

``install()`` once, before the first compile; ``calls`` lists
``(function name, group tag or None)`` of each counted call."""

import functools

import torch.distributed as dist

_GROUP_MAKERS = ("new_group", "_new_group_with_tag", "new_subgroups", "new_subgroups_by_enumeration")
_COLLECTIVES = (
    "all_gather_object", "all_reduce", "all_gather", "all_gather_into_tensor", "broadcast",
    "broadcast_object_list", "barrier", "monitored_barrier", "reduce_scatter_tensor",
    "gather_object", "scatter_object_list", "all_to_all", "reduce", "gather", "scatter",
)

depth = 0
calls = []


def _counted(name, original):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if depth > 0:
            calls.append((name, kwargs.get("pg_tag")))
        return original(*args, **kwargs)

    wrapper._ccol_counted = True
    return wrapper


def _deepening(owner, name):
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        global depth
        depth += 1
        try:
            return original(*args, **kwargs)
        finally:
            depth -= 1

    setattr(owner, name, wrapper)


def install():
    import torch._dynamo.convert_frame as convert_frame
    from torch._functorch._aot_autograd import runtime_wrappers

    c10d = dist.distributed_c10d
    for name in _GROUP_MAKERS + _COLLECTIVES:
        for module in (dist, c10d):
            original = getattr(module, name, None)
            if original is not None and not getattr(original, "_ccol_counted", False):
                setattr(module, name, _counted(name, original))
    _deepening(convert_frame, "_compile")
    _deepening(runtime_wrappers._AutogradBackwardCompiler, "get_or_compile")
