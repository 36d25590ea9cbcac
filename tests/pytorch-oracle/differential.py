#!/usr/bin/env python3
"""Randomized differential: our size-entry lattice against PyTorch's.

Generates random lattice cases (seeded, reproducible), evaluates each with
``ccol lattice-eval`` (one process for all cases) and with PyTorch 2.13's own
code, called directly:

- a tensor observation's entry comes from
  ``torch._dynamo.variables.builder.record_automatic_dynamic`` (PyTorch's
  stride recording: ``InferStride`` canonicalisation and
  ``FrameStateSizeEntry.make_tensor``), fed a meta tensor of the case's sizes
  and strides, in preflight (``tx.distributed_state.all_states is None``), as
  Dynamo calls it before a compiler collective;
- an int's entry is ``FrameStateSizeEntry.make_scalar``, a mark-dynamic hint's
  ``FrameStateSizeEntry.make_size`` (as builder.py builds it), a raw lattice
  element a ``FrameStateSizeEntry(...)``;
- each rank's local entry is the ``|=`` of its items; the persisted ("prior")
  state is put into Dynamo's code state with ``pgo.process_automatic_dynamic``
  outside a collective, then every rank's state is applied with
  ``process_automatic_dynamic`` after the exchange (``all_states`` set), the
  code path Dynamo runs after its compiler collective;
- decisions are ``FrameStateSizeEntry.is_size_dynamic`` /
  ``is_stride_dynamic`` per dimension, and ``scalar is auto_dynamic``.

Every item's entry (so every canonicalised stride), every local and merged
entry, and every decision is compared. Prints the seed, the case count and
the number of differences; exits 1 on any difference (printing the seed and
case index to rerun: ``--seed S --case I``), 2 on a usage error.

Usage::

    differential.py [--seed S] [--cases N] [--ccol PATH] [--case I] [--show N]

The seed defaults to ``CCOL_DIFFERENTIAL_SEED``, else a fresh random one
(printed). ``ccol`` is ``--ccol``, else ``CCOL_BIN``, else ``ccol`` on PATH,
else ``$CARGO_TARGET_DIR/debug/ccol``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import types
from collections import Counter

NAMES = ["x", "y", "z"]
SIZE_POOL = [0, 1, 2, 3, 4, 5, 6, 8, 16]


# --------------------------------------------------------------------------
# Random cases
# --------------------------------------------------------------------------


def contiguous(sizes):
    out, acc = [0] * len(sizes), 1
    for i in range(len(sizes) - 1, -1, -1):
        out[i] = acc
        acc *= max(sizes[i], 1)
    return out


def gen_strides(rng, sizes):
    n = len(sizes)
    r = rng.random()
    if r < 0.35:
        return None  # contiguous, strides chosen by torch / ccol themselves
    if r < 0.50:
        return contiguous(sizes)
    if r < 0.70 and n >= 2:
        # A permutation of a contiguous layout (transposes).
        perm = list(range(n))
        rng.shuffle(perm)
        phys = contiguous([sizes[p] for p in perm])
        out = [0] * n
        for k, p in enumerate(perm):
            out[p] = phys[k]
        return out
    if r < 0.85:
        # A slice of a bigger contiguous tensor (padded rows).
        bigger = [s + rng.choice([0, 0, 1, 2, 5]) for s in sizes]
        return contiguous(bigger)
    return [rng.choice([0, 1, 1, 2, 3, 4, 6, 8, 10, 12, 20]) for _ in range(n)]


def gen_atom(rng, value, unset_ok=True):
    r = rng.random()
    if r < 0.1 and unset_ok:
        return "unset"
    if r < 0.35:
        return "dyn"
    return value()


def gen_dims(rng, unset_below, dyn_below, known):
    """"unset" when one draw is below unset_below, "dyn" below dyn_below, else known()."""
    r = rng.random()
    if r < unset_below:
        return "unset"
    if r < dyn_below:
        return "dyn"
    return known()


def gen_raw(rng, base):
    scalar = rng.choice(["unset", "dyn", base["int"], rng.randint(-2, 9)])

    def sizes():
        n = base["ndim"] if rng.random() < 0.7 else rng.randint(0, 4)
        return [gen_atom(rng, lambda: rng.choice(SIZE_POOL)) for _ in range(n)]

    size = gen_dims(rng, 0.25, 0.45, sizes)

    def strides():
        # Reachable states: a stride tuple has the length of the size tuple.
        n = len(size) if isinstance(size, list) else rng.randint(0, 4)
        return [
            gen_atom(
                rng,
                lambda: {"S": rng.randrange(n)} if rng.random() < 0.3 else rng.choice([0, 1, 2, 4, 8]),
                unset_ok=False,
            )
            for _ in range(n)
        ]

    stride = gen_dims(rng, 0.3, 0.5, strides)
    return {"entry": {"scalar": scalar, "size": size, "stride": stride}}


def gen_item(rng, base, mixing):
    kind = base["kind"]
    r = rng.random()
    if r < 0.08:
        return gen_raw(rng, base)
    if r < 0.16 and base["ndim"] > 0 and kind == "tensor":
        n = base["ndim"] if rng.random() < 0.9 else rng.randint(1, 4)
        return {"mark_dynamic": [n, rng.randrange(n)]}
    if mixing and rng.random() < 0.3:
        kind = "int" if kind == "tensor" else "tensor"
    v = base["volatility"]
    if kind == "int":
        return {"int": base["int"] if rng.random() >= v else rng.randint(-3, 20)}
    n = base["ndim"] if rng.random() >= v / 3 else rng.randint(0, 4)
    sizes = [
        base["size"][d] if d < base["ndim"] and rng.random() >= v else rng.choice(SIZE_POOL)
        for d in range(n)
    ]
    if n == base["ndim"] and rng.random() >= v:
        stride = base["stride"](sizes)
    else:
        stride = gen_strides(rng, sizes)
    return {"size": sizes, "stride": stride}


def gen_items(rng, base, mixing):
    k = rng.choices([1, 2, 3], weights=[70, 20, 10])[0]
    return [gen_item(rng, base, mixing) for _ in range(k)]


def gen_case(seed: int, index: int) -> dict:
    rng = random.Random(f"ccol-differential-{seed}-{index}")
    names = NAMES[: rng.randint(1, 3)]
    # Type mismatches (tensor on one rank, int on another) in a quarter of cases.
    mixing = rng.random() < 0.25
    bases = {}
    for n in names:
        ndim = rng.choice([0, 1, 1, 2, 2, 2, 3, 4])
        size = [rng.choice(SIZE_POOL) for _ in range(ndim)]
        bases[n] = {
            "kind": "tensor" if rng.random() < 0.7 else "int",
            "ndim": ndim,
            "size": size,
            # A layout kept by most observations of the source: the same stride
            # rule (contiguous, a transpose, padded rows, ...) applied to its sizes.
            "stride": lambda sizes, seed=rng.random(): gen_strides(random.Random(seed), sizes),
            "int": rng.randint(0, 12),
            # Probability that one dimension / value / layout differs from the base.
            "volatility": rng.choice([0.0, 0.05, 0.15, 0.3, 0.6]),
        }
    prior = {n: gen_items(rng, bases[n], mixing)[:2] for n in names if rng.random() < 0.35}
    ranks = []
    for _ in range(rng.randint(1, 4)):
        ranks.append({n: gen_items(rng, bases[n], mixing) for n in names if rng.random() < 0.8})
    return {"prior": prior, "ranks": ranks}


# --------------------------------------------------------------------------
# PyTorch's side
# --------------------------------------------------------------------------


class Torch:
    def __init__(self):
        import torch
        import torch._dynamo.pgo as pgo
        from torch._dynamo.symbolic_convert import DistributedState, LocalState
        from torch._dynamo.variables.builder import record_automatic_dynamic

        self.torch = torch
        self.pgo = pgo
        self.E = pgo.FrameStateSizeEntry
        self.DistributedState = DistributedState
        self.LocalState = LocalState
        self.record_automatic_dynamic = record_automatic_dynamic
        self.code = compile("def ccol_differential(): pass", "<ccol-differential>", "exec")
        self.code_id = pgo.CodeId.make(self.code)
        if not torch._dynamo.config.automatic_dynamic_shapes:
            raise SystemExit("torch._dynamo.config.automatic_dynamic_shapes is off")

    def atom_in(self, a, stride=False):
        if a == "unset":
            return self.pgo.auto_unset
        if a == "dyn":
            return self.pgo.auto_dynamic
        if stride and isinstance(a, dict):
            return self.pgo.InferStride(a["S"])
        return a

    def tup_in(self, t, stride=False):
        if isinstance(t, list):
            return tuple(self.atom_in(a, stride) for a in t)
        return self.atom_in(t)

    def atom_out(self, a):
        if a is self.pgo.auto_unset:
            return "unset"
        if a is self.pgo.auto_dynamic:
            return "dyn"
        if isinstance(a, self.pgo.InferStride):
            return {"S": a.dim}
        if type(a) is not int:
            raise TypeError(f"unexpected atom {a!r}")
        return a

    def entry_out(self, e):
        def tup(t):
            return [self.atom_out(a) for a in t] if isinstance(t, tuple) else self.atom_out(t)

        return {"scalar": self.atom_out(e.scalar), "size": tup(e.size), "stride": tup(e.stride)}

    def item_entry(self, name, item):
        torch = self.torch
        if "size" in item:
            if item["stride"] is None:
                t = torch.empty(item["size"], device="meta")
            else:
                t = torch.empty_strided(item["size"], item["stride"], device="meta")
            # Preflight: record_automatic_dynamic stores the entry in the local
            # state and returns it.
            tx = types.SimpleNamespace(
                distributed_state=self.DistributedState(None, self.LocalState())
            )
            return self.record_automatic_dynamic(tx, name, t)
        if "int" in item:
            return self.E.make_scalar(item["int"])
        if "mark_dynamic" in item:
            ndim, dim = item["mark_dynamic"]
            mark_size = [self.pgo.auto_unset] * ndim
            mark_size[dim] = self.pgo.auto_dynamic
            return self.E.make_size(size=mark_size)
        raw = item["entry"]
        return self.E(
            scalar=self.atom_in(raw["scalar"]),
            size=self.tup_in(raw["size"]),
            stride=self.tup_in(raw["stride"], stride=True),
        )

    def decision(self, merged, item):
        if "size" in item:
            n = len(item["size"])
            return {
                "sizes": [merged.is_size_dynamic(i) for i in range(n)],
                "strides": [merged.is_stride_dynamic(i) for i in range(n)],
            }
        if "int" in item:
            return {"scalar": merged.scalar is self.pgo.auto_dynamic}
        return None

    def eval(self, case):
        pgo = self.pgo
        pgo.reset_code_state()
        tx = types.SimpleNamespace(f_code=self.code, closure=None, distributed_state=None)

        def entries(sources):
            return {n: [self.item_entry(n, it) for it in items] for n, items in sources.items()}

        prior = entries(case["prior"])
        ranks = [entries(r) for r in case["ranks"]]
        # Persisted state: automatic dynamic outside a collective.
        for name, es in prior.items():
            for e in es:
                pgo.process_automatic_dynamic(tx, name, e)
        locals_ = []
        for r in ranks:
            local = {}
            for name, es in r.items():
                acc = self.E()
                for e in es:
                    acc |= e
                local[name] = acc
            locals_.append(local)
        # After the compiler collective: every rank's state applied.
        tx.distributed_state = self.DistributedState(
            None, self.LocalState(), [self.LocalState(automatic_dynamic=dict(l)) for l in locals_]
        )
        for name in sorted({n for l in locals_ for n in l}):
            pgo.process_automatic_dynamic(tx, name, self.E())
        state = pgo.get_code_state()[self.code_id].automatic_dynamic
        merged = {n: state[n] for n in sorted(set(prior) | {n for l in locals_ for n in l})}

        def items_out(sources, es):
            return {
                n: [
                    {"entry": self.entry_out(e), "decision": self.decision(merged[n], it)}
                    for it, e in zip(items, es[n])
                ]
                for n, items in sources.items()
            }

        return {
            "items": {
                "prior": items_out(case["prior"], prior),
                "ranks": [items_out(s, e) for s, e in zip(case["ranks"], ranks)],
            },
            "local": [{n: self.entry_out(e) for n, e in l.items()} for l in locals_],
            "merged": {n: self.entry_out(e) for n, e in merged.items()},
        }


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------


def find_ccol(flag):
    if flag:
        return flag
    if os.environ.get("CCOL_BIN"):
        return os.environ["CCOL_BIN"]
    on_path = shutil.which("ccol")
    if on_path:
        return on_path
    target = os.environ.get("CARGO_TARGET_DIR")
    if target and os.path.exists(os.path.join(target, "debug", "ccol")):
        return os.path.join(target, "debug", "ccol")
    raise SystemExit("differential: cannot find ccol (give --ccol, CCOL_BIN or PATH)")


def first_difference(a, b, path="$"):
    if type(a) is not type(b):
        return f"{path}: ccol {json.dumps(a)} / pytorch {json.dumps(b)}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: ccol {json.dumps(a.get(k))} / pytorch {json.dumps(b.get(k))}"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: ccol {json.dumps(a)} / pytorch {json.dumps(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: ccol {json.dumps(a)} / pytorch {json.dumps(b)}"


def coverage(case, out, stats: Counter) -> None:
    for sources in [case["prior"], *case["ranks"]]:
        for items in sources.values():
            for it in items:
                stats["items." + next(iter(it))] += 1
                if "size" in it and it["stride"] is not None:
                    stats["items.size.explicit_stride"] += 1
    names = {n for r in case["ranks"] for n in r}
    for n in names:
        if not all(n in r for r in case["ranks"]):
            stats["sources missing on some ranks"] += 1
    for n, e in out["merged"].items():
        if e["size"] == "dyn" and e["scalar"] != "dyn":
            stats["merged: whole size dynamic"] += 1
        if isinstance(e["size"], list) and "dyn" in e["size"]:
            stats["merged: some size dims dynamic"] += 1
        if e["scalar"] == "dyn" and e["size"] == "dyn":
            stats["merged: everything dynamic (type mismatch)"] += 1
        if isinstance(e["stride"], list) and any(isinstance(a, dict) for a in e["stride"]):
            stats["merged: InferStride kept"] += 1
    for r in out["items"]["ranks"]:
        for outs in r.values():
            for o in outs:
                d = o["decision"]
                if d and "strides" in d and any(d["strides"]):
                    stats["decisions: a dynamic stride"] += 1
                if d and "sizes" in d and any(d["sizes"]):
                    stats["decisions: a dynamic size"] += 1


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--case", type=int, default=None, help="run only this case index")
    ap.add_argument("--ccol", default=None)
    ap.add_argument("--show", type=int, default=5, help="differences to print in full")
    a = ap.parse_args(argv)
    seed = a.seed
    if seed is None and os.environ.get("CCOL_DIFFERENTIAL_SEED"):
        seed = int(os.environ["CCOL_DIFFERENTIAL_SEED"])
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 32)
    indices = [a.case] if a.case is not None else list(range(a.cases))
    print(f"differential: seed {seed}, {len(indices)} cases", flush=True)
    cases = [gen_case(seed, i) for i in indices]
    ccol = find_ccol(a.ccol)
    proc = subprocess.run(
        [ccol, "lattice-eval"],
        input="".join(json.dumps(c) + "\n" for c in cases),
        capture_output=True,
        text=True,
        check=False,
    )
    ours = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or len(ours) != len(cases):
        print(
            f"differential: `{ccol} lattice-eval` exited {proc.returncode} with "
            f"{len(ours)} results for {len(cases)} cases\n{proc.stderr[-4000:]}",
            file=sys.stderr,
        )
        for o in ours:
            if "error" in o:
                print(f"  {o['error']}", file=sys.stderr)
                break
        return 1
    torch_side = Torch()
    differences = 0
    stats: Counter = Counter()
    for index, case, mine in zip(indices, cases, ours):
        try:
            theirs = torch_side.eval(case)
        except Exception as e:  # noqa: BLE001 - a PyTorch error is a difference
            theirs = {"pytorch raised": f"{type(e).__name__}: {e}"}
        coverage(case, mine, stats)
        if mine != theirs:
            differences += 1
            if differences <= a.show:
                print(f"DIFFERENCE seed {seed} case {index} (rerun: --seed {seed} --case {index})")
                print(f"  {first_difference(mine, theirs)}")
                print(f"  case:    {json.dumps(case)}")
                print(f"  ccol:    {json.dumps(mine)}")
                print(f"  pytorch: {json.dumps(theirs)}")
    print("coverage: " + ", ".join(f"{k} {v}" for k, v in sorted(stats.items())))
    print(f"differential: seed {seed}: {len(cases)} cases, {differences} differences")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
