"""The rank program of test_compile_once.py.

A model of CCOL_CO_PIECES pieces (a graph break between each, so one
Inductor graph pair per piece: forward and backward), trained for
CCOL_CO_STEPS steps with DDP-style gradients (an all_reduce of each
gradient after ``backward()``, on torch's Gloo group), compiled by Inductor
on CPU. Each rank's Inductor cache directory is CCOL_CO_DIR_<rank> (the
test gives ranks of one simulated node the same one).

CCOL_CO_MODE: "package" (``enable(compile_once=True)``), "shard"
(``enable(compile_once=True, shard_kernels=True)``), "package_off"
(``enable()``), "alone" (no package). CCOL_CO_HOOK, set on every rank
(only an owner's compile or a sender acts on it): "raise" (the owner's
compile raises), "sleep_raise=S" (it sleeps S seconds, then raises),
"kill" (the owner kills itself, SIGKILL); each emits an "owner" event with
the time just before it raises or kills. With "shard", "build_raise" and
"build_kill" act on the first kernel a rank builds for another (its build
raises, or the process kills itself) on job rank CCOL_CO_HOOK_RANK (default
0), emitting "owner" the same way. CCOL_CO_LIST_DIFFERS=R[:N]: job rank R's
kernel lists (in round N of each sharded compile only) read as another
graph's. CCOL_CO_CORRUPT=R: job rank R, as a
sender, flips a byte of the first chunk it sends. CCOL_CO_RANK_SPECIFIC=1:
the first piece bakes the rank into its graph (a constant), so each rank's
key for it differs. CCOL_CO_TIMEOUT: enable's deadline.

Events: "step" (the losses, the Inductor lowerings counted here: each
compile creates one GraphLowering; the kernels' shared objects built here,
counted at Inductor's C++ builder; the package's counters; AOTAutograd's
cache counters; seconds to the end of the first step) or "raised" (the
error's class, message and attributes)."""

from prelude import *

import torch.nn as nn
from torch._dynamo.utils import counters

os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.environ[f"CCOL_CO_DIR_{RANK}"]

import torch._inductor.graph as inductor_graph  # noqa: E402
from compiler_collectives import _compile_once  # noqa: E402

lowerings = [0]
_init = inductor_graph.GraphLowering.__init__


def _counting_init(self, *args, **kwargs):
    lowerings[0] += 1
    _init(self, *args, **kwargs)


inductor_graph.GraphLowering.__init__ = _counting_init

import torch._inductor.cpp_builder as cpp_builder  # noqa: E402

builds: list = []
_build = cpp_builder.CppBuilder.build


def _counting_build(self, *args, **kwargs):
    target = self.get_target_file_path()
    if target.endswith(".main.so"):
        builds.append(os.path.basename(target))
    return _build(self, *args, **kwargs)


cpp_builder.CppBuilder.build = _counting_build

if os.environ.get("CCOL_CO_LOG"):
    import logging

    logging.basicConfig(format=f"%(relativeCreated)d rank {RANK} %(name)s: %(message)s")
    logging.getLogger("compiler_collectives").setLevel(os.environ["CCOL_CO_LOG"])
mode = os.environ.get("CCOL_CO_MODE", "package")
hook, _, hook_value = os.environ.get("CCOL_CO_HOOK", "").partition("=")


def in_owner_compile():
    if hook == "sleep_raise":
        time.sleep(float(hook_value))
    emit(event="owner", time=time.time(), hook=hook)
    if hook in ("raise", "sleep_raise"):
        raise RuntimeError(f"the owner's compile failed on purpose (job rank {RANK})")
    if hook == "kill":
        os.kill(os.getpid(), 9)


def in_shard_build(key):
    emit(event="owner", time=time.time(), hook=hook, kernel=key)
    if hook == "build_raise":
        raise RuntimeError(f"the kernel build failed on purpose (job rank {RANK})")
    os.kill(os.getpid(), 9)


if hook in ("build_raise", "build_kill"):
    if RANK == int(os.environ.get("CCOL_CO_HOOK_RANK", "0")):
        _compile_once.test_hooks["shard_build"] = in_shard_build
elif hook:
    _compile_once.test_hooks["in_owner_compile"] = in_owner_compile
differs, _, in_round = os.environ.get("CCOL_CO_LIST_DIFFERS", "").partition(":")
if differs == str(RANK):
    _compile_once.test_hooks["shard_list_differs"] = int(in_round) if in_round else True
if os.environ.get("CCOL_CO_CORRUPT") == str(RANK):
    _compile_once.test_hooks["corrupt"] = True
if mode != "alone":
    cct.enable(timeout=float(os.environ.get("CCOL_CO_TIMEOUT", "60")),
               compile_once=mode in ("package", "shard"), shard_kernels=mode == "shard")

scale = RANK + 1 if os.environ.get("CCOL_CO_RANK_SPECIFIC") == "1" else 1
pieces = min(3, int(os.environ.get("CCOL_CO_PIECES", "2")))
torch.manual_seed(0)
layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(pieces))


@torch.compile(backend="inductor")
def forward(x):
    # Graph breaks outside any loop (Dynamo skips a frame whose loop breaks).
    x = torch.relu(layers[0](x)) * scale
    if pieces > 1:
        torch._dynamo.graph_break()
        x = torch.relu(layers[1](x)) * 2
    if pieces > 2:
        torch._dynamo.graph_break()
        x = torch.relu(layers[2](x)) * 3
    return x.square().mean()


def done():
    """Exits at once: torch's own teardown (C++ destructors, about 1.5 s of a
    rank's time on 2 cores) is not what these jobs test."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


started = time.perf_counter()
losses, first_step = [], None
try:
    for step in range(int(os.environ.get("CCOL_CO_STEPS", "2"))):
        g = torch.Generator().manual_seed(100 * step + RANK)
        x = torch.randn(4, 8, generator=g)
        loss = forward(x)
        loss.backward()
        for p in layers.parameters():
            dist.all_reduce(p.grad)
            p.grad /= WORLD
        with torch.no_grad():
            for p in layers.parameters():
                p -= 0.1 * p.grad
                p.grad = None
        losses.append(loss.item())
        if first_step is None:
            first_step = time.perf_counter() - started
except compiler_collectives.Error as e:
    emit(event="raised", cls=type(e).__name__, message=str(e), time=time.time(),
         missing_ranks=list(e.missing_ranks),
         owner=getattr(e, "owner", None), exc_type=getattr(e, "exc_type", None),
         exc_message=getattr(e, "exc_message", None), seconds=time.perf_counter() - started)
    done()
except RuntimeError as e:
    emit(event="raised", cls=type(e).__name__, message=str(e)[:500],
         seconds=time.perf_counter() - started)
    done()
emit(event="step", losses=[float.hex(v) for v in losses], lowerings=lowerings[0],
     builds=sorted(builds),
     package=dict(counters["compiler_collectives"]), aot=dict(counters["aot_autograd"]),
     first_step=first_step)
cct.disable()
dist.destroy_process_group()
done()
