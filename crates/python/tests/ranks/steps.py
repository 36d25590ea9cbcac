"""A compiled function and a counting backend for the rank programs
(``from steps import *`` after the prelude): f(x) = (x * 2).sum() under
torch.compile; `compiles` gets, per compile, the dims its graph made
dynamic; run(sizes) calls f on a (n, 8) tensor for each n of `sizes`,
calling before_step(step) first when given."""

import torch

compiles = []


def backend(gm, example_inputs):
    from torch.fx.experimental.symbolic_shapes import free_symbols
    dyn = []
    for node in gm.graph.nodes:
        v = node.meta.get("example_value") if node.op == "placeholder" else None
        if isinstance(v, torch.Tensor):
            dyn += [i for i, d in enumerate(v.size()) if free_symbols(d)]
    compiles.append(dyn)
    return gm.forward


@torch.compile(backend=backend)
def f(x):
    return (x * 2).sum()


def run(sizes, before_step=None):
    for step, n in enumerate(sizes):
        if before_step is not None:
            before_step(step)
        f(torch.ones(n, 8))


__all__ = ["compiles", "backend", "f", "run"]
