"""The rank program of test_shard.py's Triton rounds, on CPU: a sharded
compile's round of CCOL_ST_KERNELS Triton kernels, with a stand-in for
Triton's compile (CPU CI has no Triton).

Each rank's Inductor cache directory is CCOL_ST_DIR_<rank>, its Triton
cache directory that directory's ``triton/<device index>`` (Inductor's
default). Each rank's kernels name its own device index (``cuda:<rank>``)
in their sources, as Inductor writes them on a node of several GPUs, so
that the round must name them alike.

The stand-in (``AsyncCompile.triton`` where the round builds or loads a
kernel) does what Triton's cache does: it looks for the kernel's entry,
``<hash of the source without the device index>/``, in the rank's Triton
cache directory; a hit needs the entry's JSON file to name the entry's own
directory (Triton reads its files from the paths written there). A miss
writes the entry: the kernel's binary, its JSON file, a group file naming
both by absolute path. It returns a future of the kernel: its name, whether
it was a hit, and the bytes of its binary.

Before the module's calls, as Inductor does while it writes the module,
an early submission of the second kernel (``_emit_kernel_to_wrapper``) and
an autotuning caller's kernel, ``triton_tune_0``.

CCOL_ST_CORRUPT=R: job rank R, as a sender, flips a byte of the first chunk
it sends. CCOL_ST_SLOW=R: each build of a round's kernel on job rank R takes
CCOL_ST_SLOW_S seconds (default 2), so that the other rank takes its share
over. CCOL_ST_HELD=R: job rank R holds the first kernel in memory
already (``CompiledTritonKernels``), so it does not hold that kernel's
build.

Events: "round" (the kernels the round held, the kernels as Inductor's
``wait`` left them in the module's scope, the stand-in's builds and hits, the package's counters)."""

from prelude import *

import concurrent.futures
import hashlib

os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.environ[f"CCOL_ST_DIR_{RANK}"]
os.environ.pop("TRITON_CACHE_DIR", None)

from torch._dynamo.utils import counters  # noqa: E402
from torch._inductor.async_compile import AsyncCompile, CompiledTritonKernels  # noqa: E402
from torch._inductor.runtime.cache_dir_utils import triton_cache_dir  # noqa: E402

from compiler_collectives import _shard, _shipping  # noqa: E402
from compiler_collectives import _state  # noqa: E402

builds, hits = [], []


def source_of(i: int) -> str:
    return (f"@triton_heuristics.pointwise(size_hints={{'x': {64 << i}}}, "
            f"triton_meta={{'signature': {{'in_ptr0': '*fp32'}}, 'device': DeviceProperties("
            f"type='cuda', index={RANK}, multi_processor_count=132, cc=90, major=9)}})\n"
            f"@triton.jit\ndef triton_poi_{i}(in_ptr0, xnumel, XBLOCK: tl.constexpr):\n"
            + "    x = tl.load(in_ptr0)\n" * (i + 1))


def stand_in(ac, name: str, source: str, device_str: str = "cuda"):
    where = triton_cache_dir(RANK)
    entry = os.path.join(where, "E" + hashlib.sha256(
        source.replace(f"index={RANK}", "index=?").encode()).hexdigest()[:40].upper())
    meta = os.path.join(entry, f"{name}.json")
    if os.path.isfile(meta):
        with open(meta) as f:
            named = json.load(f)["dir"]
        assert named == entry, (named, entry)
        hits.append(name)
    else:
        builds.append(name)
        if os.environ.get("CCOL_ST_SLOW") == str(RANK) and name.startswith("triton_poi_"):
            time.sleep(float(os.environ.get("CCOL_ST_SLOW_S", "2")))
        os.makedirs(entry, exist_ok=True)
        with open(os.path.join(entry, f"{name}.cubin"), "wb") as f:
            # The binary does not depend on the device index (Triton's doesn't).
            f.write(hashlib.sha256(source.replace(f"index={RANK}", "").encode()).digest() * 64)
        with open(meta, "w") as f:
            json.dump({"dir": entry, "name": name}, f)
        with open(os.path.join(entry, f"__grp__{name}.json"), "w") as f:
            json.dump({"child_paths": {f"{name}.cubin": os.path.join(entry, f"{name}.cubin"),
                                       f"{name}.json": meta}}, f)
    with open(os.path.join(entry, f"{name}.cubin"), "rb") as f:
        binary = hashlib.sha256(f.read()).hexdigest()
    future = concurrent.futures.Future()
    future.set_result({"name": name, "binary": binary})
    return future


os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "2"
cct.enable(timeout=60, compile_once=True, shard_kernels=True)
_shipping.test_hooks["shard_triton"] = stand_in
if os.environ.get("CCOL_ST_CORRUPT") == str(RANK):
    _shipping.test_hooks["corrupt"] = True
n = int(os.environ.get("CCOL_ST_KERNELS", "6"))
if os.environ.get("CCOL_ST_HELD") == str(RANK):
    CompiledTritonKernels.save(source_of(0), stand_in(None, "triton_poi_0", source_of(0)))
    builds.clear()  # built before the round, as by an earlier graph

st = _state.current
sharding = _shard.Sharding(st, "test", [frozenset({r}) for r in range(WORLD)])
_shard._tls.sharding = sharding
ac = AsyncCompile()


def _emit_kernel_to_wrapper():
    """Inductor's early submission while it writes the module: it builds
    nothing in a sharded compile (the module's own call is held)."""
    return ac.triton("triton_poi_1", source_of(1), "cuda")


def autotune():
    """Any other caller (autotuning, a benchmark) needs its kernel now."""
    return ac.triton("triton_tune_0", source_of(9), "cuda").result()


early = _emit_kernel_to_wrapper()
tuned = autotune()
# As the graph's wrapper module does it: its own calls, at module level.
scope = {}
for i in range(n):
    scope[f"triton_poi_{i}"] = ac.triton(f"triton_poi_{i}", source_of(i), "cuda")
held = sorted(k.task[1] for k in sharding.held)
ac.wait(scope)
_shard._tls.sharding = None
sharding.finish()
emit(event="round", early=early, tuned=tuned, held=held, scope=scope, builds=builds, hits=hits,
     package=dict(counters["compiler_collectives"]))
sys.stdout.flush()
os._exit(0)
