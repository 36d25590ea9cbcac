"""Work deferred until torch imports a module: what ``enable`` would
otherwise pay for at once. Installing Inductor's distributed autotuning
agreement imports ``torch._inductor.distributed_autotune`` (about 590
modules of Inductor, 1.3 s on this project's machine) and the partitioner's
imports ``torch._functorch.partitioners`` (0.5 s), which a job compiling
with ``aot_eager`` or ``eager`` never needs; so each is installed when torch
imports its module, or at once where it is imported already.

:func:`when_imported` registers a callback; a finder first on
``sys.meta_path`` runs the module's own loader, then the callbacks, before
the module is handed to whoever imported it. Imports nothing of torch.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from typing import Callable, Dict, List

_lock = threading.RLock()
# Module name -> callbacks waiting for it.
_pending: Dict[str, List[Callable]] = {}


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the callbacks waiting for it."""

    def __init__(self, inner, name: str) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        with _lock:
            callbacks = _pending.pop(self._name, [])
            if not _pending:
                _remove_finder()
        for callback in callbacks:
            callback(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


_finder = _Finder()


def _remove_finder() -> None:
    try:
        sys.meta_path.remove(_finder)
    except ValueError:
        pass


def when_imported(name: str, callback: Callable) -> Callable[[], None]:
    """Calls ``callback(module)`` once module ``name`` is imported: at once
    if it is already. Returns a function that cancels it (if it has not run)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return lambda: None
    with _lock:
        _pending.setdefault(name, []).append(callback)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)

    def cancel() -> None:
        with _lock:
            waiting = _pending.get(name)
            if waiting and callback in waiting:
                waiting.remove(callback)
                if not waiting:
                    del _pending[name]
            if not _pending:
                _remove_finder()

    return cancel
