"""The package's state while :func:`compiler_collectives.torch.enable` is in
effect: one :class:`State` per process (``current``), shared by the modules
that hook into torch (``_frames``, ``_votes``, ``_surface``, the agreements).
Imports nothing of torch."""

from __future__ import annotations

import os
from typing import Callable, Optional


class Group:
    """What ``get_compile_pg`` returns while enabled: a stand-in for Dynamo's
    compile group (``DistributedState.compile_pg``), never a torch process
    group. Only this package's ``run_compiler_collective`` uses it."""

    def __init__(self, channel) -> None:
        self.channel = channel

    def rank(self) -> int:
        return self.channel.rank

    def size(self) -> int:
        return self.channel.world_size

    def __repr__(self) -> str:
        return f"compiler_collectives.torch group ({self.channel!r})"


class State:
    """What ``enable`` set up: the channel, its switches, what to undo.

    ``exchange`` is ``"auto"`` or ``"always"`` and ``guard_votes`` is
    ``"auto"``, ``True`` or ``False`` (``enable``'s arguments); ``votes_on``
    is whether every compiled call votes now (from the start with
    ``guard_votes=True``; with ``"auto"``, from the first exchanged compile
    whose agreed "holds collectives" bit was set: ``_policy``)."""

    def __init__(self, channel, guard_votes=False, cache_agreement: bool = False,
                 check_graphs: bool = False, exchange: str = "always") -> None:
        self.channel = channel
        self.group = Group(channel)
        self.guard_votes = guard_votes
        self.votes_on = guard_votes is True
        # Whether the guard-complete hook is installed (``_votes.turn_on``).
        self.hook_installed = False
        # What the agreement policy remembers (``_policy.Tracking``).
        self.policy = None
        # The out-of-band notice path (``_notice.Notices``), or None.
        self.notices = None
        # The agreements' switches as enable() saw them (``_checks.switches``).
        self.switches: dict = {}
        # disable() ran: what was deferred (``_lazy``) is not installed.
        self.disabled = False
        self.exchange = exchange
        # enable(skip_restart=...), and why this torch never skips
        # (``_compat.restart_skip_gate``): ``_restart``.
        self.skip_restart = True
        self.skip_gate: Optional[str] = None
        self.cache_agreement = cache_agreement
        # enable(compile_once=..., max_artifact_bytes=...), and what
        # ``_compile_once`` keeps: the cache directory's token and groups,
        # the keys logged as rank-specific.
        self.compile_once = False
        self.max_artifact_bytes = 0
        self.compile_timeout: Optional[float] = None
        self.shard_kernels = False
        # The cost (bytes of C++ source) of the kernels this rank built in
        # sharded compiles: exchanged in each round, so that rounds spread.
        self.shard_load = 0
        self.compile_once_dirs = None
        self.compile_once_specific: set = set()
        self.compile_once_lookups = 0
        self.compile_once_warmth = 0
        self.check_graphs = check_graphs
        # The first error of an exchange that has not reached the caller yet
        # (a failed guard vote, or one Dynamo suppressed).
        self.pending: Optional[BaseException] = None
        self.restore: list[Callable[[], None]] = []
        self.pid = os.getpid()
        # An uncaught exception is on its way out of the process: at exit the
        # channel aborts (peers see this rank lost), it does not say "no
        # more exchanges".
        self.crashed = False
        # The job ranks of the channel's members, ascending (enable's group).
        self.ranks: list[int] = []
        # The job's store (the default process group's) and this channel's
        # prefix in it (with torchrun's run id and restart count): where
        # sharded compiles claim kernels (``_shard``).
        self.store = None
        self.store_prefix = ""


#: The state while enabled, else None.
current: Optional[State] = None


def patch(st: State, owner, name: str, value) -> None:
    """Sets ``owner.name`` (a class's own attribute, or a module's) to
    ``value``, and records in ``st.restore`` how to put the old one back."""
    old = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, value)
    st.restore.append(lambda: setattr(owner, name, old))
