"""The rank program of test_ranks.py's group tests: 4 ranks, two pipeline
stages of 2 replicas (stage A = ranks 0 and 1, stage B = ranks 2 and 3),
each stage compiling its own module with shapes that differ between its
replicas. CCOL_TEST_GROUPS: "stages" (every rank passes its stage: stage A
as a list of ranks, stage B as a torch ProcessGroup), "mesh" (a 2 × 2
DeviceMesh ("pp", "dp"): stage A passes (mesh, "dp"), stage B the 1-D mesh
mesh["dp"]), "world" (every rank enables on the world), "absent" (stages;
rank 3 never compiles), "dynamo" (no package: Dynamo's own compiler
collectives on the world, run under tests/pytorch_patched.py for the
record; no test runs it)."""

from prelude import *

from steps import backend, compiles

case = os.environ["CCOL_TEST_GROUPS"]


@torch.compile(backend=backend)
def stage_a(x):
    return (x * 2).sum()


@torch.compile(backend=backend)
def stage_b(x):
    return (x + 1).mean()


# Every rank makes both groups (new_group is a collective of the world),
# before enable: none runs during the steps.
pg_a = dist.new_group([0, 1])
pg_b = dist.new_group([2, 3])
stage = "a" if RANK < 2 else "b"
if case == "mesh":
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    group = (mesh, "dp") if stage == "a" else mesh["dp"]
else:
    group = None if case == "world" else ([0, 1] if stage == "a" else pg_b)
calls = {}
for name in ["all_gather_object", "all_gather", "all_reduce", "broadcast", "barrier", "new_group"]:
    real = getattr(dist, name)
    def counting(*a, _real=real, _name=name, **k):
        calls[_name] = calls.get(_name, 0) + 1
        return _real(*a, **k)
    setattr(dist, name, counting)
if case == "dynamo":
    torch._dynamo.config.enable_compiler_collectives = True
    info = {"group": list(range(WORLD)), "rank": RANK, "world_size": WORLD}
else:
    cct.enable(timeout=5, group=group)
    info = cct.channel_info()
# Scenario 1's sizes within each stage: one compile each, dim 0 dynamic.
sizes = {0: [5, 8, 6], 1: [6, 6, 3], 2: [3, 9, 4], 3: [9, 9, 2]}[RANK]
fn = stage_a if stage == "a" else stage_b
start = time.monotonic()
try:
    if case == "absent" and RANK == 3:
        time.sleep(9)
    else:
        for n in sizes:
            fn(torch.ones(n, 8))
    emit(ev="done", error=None, compiles=compiles, calls=calls, group=info["group"],
         rank=info["rank"], world=info["world_size"],
         next=cct.channel_info()["next_exchange"] if cct.is_enabled() else None)
except compiler_collectives.Error as e:
    emit(ev="done", error=e.kind, missing=getattr(e, "missing_ranks", None), message=str(e),
         waited=time.monotonic() - start, group=info["group"])
cct.disable()
