"""How the package's errors reach the caller of a compiled call: as
themselves (not Dynamo's ``InternalTorchDynamoError``, never an eager
fallback under ``suppress_errors``, never a process abort), and, under
torchrun, in ``TORCHELASTIC_ERROR_FILE`` too."""

from __future__ import annotations

import json
import logging
import os
import time
import traceback
from typing import Optional

from . import _notice, _state
from ._errors import Desync, Error, InvalidArgument, Timeout, Unsupported

log = logging.getLogger("compiler_collectives.torch")


def our_error(e: BaseException) -> Optional[BaseException]:
    """This package's error in e's chain (Dynamo re-raises ``from None``,
    keeping the original only as ``__context__``)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, Error):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def report(e: BaseException) -> None:
    """Writes e to TORCHELASTIC_ERROR_FILE, as torchrun's ``@record`` would."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {
        "message": {
            "message": f"{type(e).__name__}: {e}",
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(type(e), e, e.__traceback__)),
                "timestamp": str(int(time.time())),
            },
        }
    }
    try:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError as io:
        log.warning("cannot write the torchelastic error file %s: %s", path, io)


#: What a Timeout or Desync of a frame exchange or guard vote adds to its
#: message: the usual cause, and its remedy.
LOCAL_HINT = (
    " If a compiled call is made on some ranks only (an evaluation on rank 0), "
    "make it inside compiler_collectives.torch.local()."
)


def with_hint(e: BaseException) -> None:
    """Adds :data:`LOCAL_HINT` to a ``Timeout`` or ``Desync`` of a frame
    exchange or a guard vote (once)."""
    from ._votes import GUARD_VOTE_KEY

    if not isinstance(e, (Timeout, Desync)) or LOCAL_HINT in e.message:
        return
    key = e.key or ""
    if key.startswith("torch.frame") or key == GUARD_VOTE_KEY:
        if not e.message.endswith("."):
            e.message += "."
        e.message += LOCAL_HINT
        e.args = (e.message,)


def surface(e: BaseException):
    """Raises e (an error of an exchange) to the caller of the compiled code."""
    st = _state.current
    if st is not None and st.pending is e:
        st.pending = None
    if isinstance(e, Error):
        with_hint(e)
        report(e)
        if st is not None and st.notices is not None and not isinstance(
            e, (InvalidArgument, Unsupported)
        ):
            # The other ranks say why at once, whatever they are doing.
            st.notices.post(_notice.failure_line(st.ranks[st.channel.rank] if st.ranks
                                                 else -1, e))
    # Dynamo's InternalTorchDynamoError wrapping it says nothing more.
    raise e.with_traceback(e.__traceback__) from None


def make_catch_errors_call(original):
    def __call__(self, frame, cache_entry, frame_state):
        st = _state.current
        if st is not None and st.pending is not None:
            surface(st.pending)
        try:
            result = original(self, frame, cache_entry, frame_state)
        except BaseException as e:
            ours = our_error(e)
            if ours is None:
                raise
            surface(ours)
        st = _state.current
        if st is not None and st.pending is not None:
            # Dynamo suppressed it (config.suppress_errors) and would run eager.
            surface(st.pending)
        return result

    __call__.__wrapped__ = original
    return __call__

