"""The rank program of test_agreements.py's cache-skew cases.

A training step compiled by Inductor on CPU whose joint graph holds a
functional collective, with functorch's ``_sync_decision_cross_ranks`` on
(the partitioner's decision sync). Each rank has its own Inductor cache
directory (``TORCHINDUCTOR_CACHE_DIR``, set by the test), which an earlier
run may have warmed: the test runs it once on both ranks, then wipes rank
1's directory, so that rank 0 hits AOTAutograd's cache and rank 1 misses.

CCOL_SKEW_MODE: "package" (``enable(cache_agreement=True)``), "torch"
(torch's own ``_sync_cache_decision_cross_ranks``, 2.15, without the
package), "alone" (torch's partitioner sync only, no agreement: for the
record, under an external limit), or "package_dies" (the package; rank 1
exits in its cache lookup, just before its vote). For the record,
"spmd_alone" and "spmd_package": Inductor's SPMD check on (with its
reordering pass) instead of the partitioner's sync, without the package and
with ``enable(cache_agreement=True)``. Events: "step" (the gradient,
AOTAutograd's cache counters, the counted torch group creations and
collectives, the channel's
exchanges, the seconds spent in each agreement) or "raised" (the error)."""

from prelude import *

import torch._functorch.config as functorch_config
import torch.distributed._functional_collectives as funcol
from torch._dynamo.utils import counters

import torch_comms

mode = os.environ["CCOL_SKEW_MODE"]
if mode.startswith("spmd_"):
    import torch._inductor.config as inductor_config

    inductor_config.aten_distributed_optimizations.spmd_check = True
    inductor_config.reorder_for_compute_comm_overlap = True
else:
    functorch_config._sync_decision_cross_ranks = True
if mode == "torch":
    functorch_config._sync_cache_decision_cross_ranks = True
elif mode not in ("alone", "spmd_alone"):
    cct.enable(timeout=float(os.environ.get("CCOL_SKEW_TIMEOUT", "60")), cache_agreement=True)
# After enable(), which refuses a torch whose functions were replaced.
torch_comms.install()

import torch._functorch._aot_autograd.autograd_cache as autograd_cache  # noqa: E402
import torch._functorch.partitioners as partitioners  # noqa: E402

spent = {}


def timed(owner, name, what):
    """Adds the seconds each call of owner.name takes to spent[what]."""
    original = owner.__dict__[name]
    inner = original.__func__ if isinstance(original, staticmethod) else original

    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[what] = spent.get(what, 0.0) + time.perf_counter() - started

    setattr(owner, name, staticmethod(wrapper) if isinstance(original, staticmethod) else wrapper)


if "sync_cache_decision_cross_ranks" in autograd_cache.__dict__:
    timed(autograd_cache, "sync_cache_decision_cross_ranks", "cache_vote")
timed(partitioners, "_sync_decision_cross_ranks", "partitioner_sync")
if mode.startswith("spmd_"):
    import torch._inductor.fx_passes.spmd_check as spmd_check

    timed(spmd_check, "spmd_check", "spmd_check")
if mode == "package_dies" and RANK == 1:
    def dies(*args, **kwargs):
        os._exit(3)

    autograd_cache.AOTAutogradCache.find_guarded_entry = staticmethod(dies)


@torch.compile(backend="inductor")
def step(x, w):
    s = funcol.all_reduce(x.sum().reshape(1), "sum", dist.group.WORLD)
    return ((x @ w).relu() * s).sum()


x = torch.ones(4, 4)
w = torch.full((4, 4), 0.5, requires_grad=True)
started = time.monotonic()
if mode == "package_dies":
    try:
        step(x, w).backward()
        emit(ev="raised", type=None)
    except compiler_collectives.Error as e:
        emit(ev="raised", type=type(e).__name__, key=e.key, missing=e.missing_ranks,
             message=str(e), seconds=time.monotonic() - started)
    sys.exit(0)
step(x, w).backward()
info = cct.channel_info() if cct.is_enabled() else None
emit(ev="step", grad=w.grad.tolist(), seconds=time.monotonic() - started,
     hits=counters["aot_autograd"]["autograd_cache_hit"],
     misses=counters["aot_autograd"]["autograd_cache_miss"],
     bypasses=counters["aot_autograd"]["autograd_cache_bypass"],
     guard_misses=counters["aot_autograd"]["autograd_cache_guard_miss"],
     dropped=counters["compiler_collectives"]["autograd_cache_hit_dropped"],
     torch_comms=torch_comms.calls,
     exchanges=None if info is None else info["next_exchange"], spent=spent)
if cct.is_enabled():
    cct.disable()
