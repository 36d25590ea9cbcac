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


def count_compiles(sizes=(3, 3, 5, 7)) -> list:
    """Compiles ``x.sum()`` (a new function, a backend that counts) and calls
    it on a tensor of each size; returns each compile's number of inputs (1
    static, 2 with dim 0 dynamic: a symbol and the tensor)."""
    counted = []

    def counting(gm, example_inputs):
        counted.append(len(example_inputs))
        return gm.forward

    @torch.compile(backend=counting)
    def total(x):
        return x.sum()

    for n in sizes:
        assert total(torch.ones(n)).item() == n
    return counted


def run(sizes, before_step=None):
    for step, n in enumerate(sizes):
        if before_step is not None:
            before_step(step)
        f(torch.ones(n, 8))


__all__ = ["compiles", "backend", "f", "run", "count_compiles"]
