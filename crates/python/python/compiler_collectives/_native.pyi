"""Type stubs of the extension module (crates/python/src/lib.rs)."""

from typing import Any, List

VERSION: str
WIRE_VERSION: int

class CompileChannel:
    """One rank's channel for compile decisions: the protocol's Channel over a
    Gloo process group of its own, rendezvoused through ``store``."""

    def __init__(
        self,
        store: Any,
        rank: int,
        world_size: int,
        *,
        prefix: str,
        timeout_s: float,
        hostname: str,
        pgo: Any,
        local_state_type: Any,
    ) -> None: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def store(self) -> str: ...
    @property
    def next_exchange(self) -> int | None: ...
    def exchange_local_state(self, key: str, local_state: Any) -> List[Any]: ...
    def vote_all_hit(self, key: str, hit: bool) -> bool: ...
    def agree(self, key: str, config: str) -> None: ...
    def shutdown(self) -> None: ...
    def abort(self) -> None: ...
