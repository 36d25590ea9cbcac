"""Which tested torch version the installed torch follows, from what
``_compat`` read of it and the version table: ``decide`` and its refusal.
Imports nothing of torch."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from ._compat import nearest, plain, release, restart_skip_gate


class Refusal(Exception):
    """enable() must refuse; str() is the message."""


def _show(value: Any) -> str:
    if value is None:
        return "absent"
    if value is True:
        return "present"
    if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value):
        return f"source sha256 {value[:12]}"
    return str(value)


def differences(observed: Dict[str, Any], known: Dict[str, Any], version: str,
                entries: Dict[str, dict], problems: Optional[Dict[str, str]] = None) -> List[str]:
    """Each entry whose observed value is not torch `version`'s, in words."""
    problems = problems or {}
    out = []
    for path, entry in entries.items():
        mine, theirs = observed.get(path), known.get(path)
        if mine == theirs:
            continue
        if isinstance(mine, str) and mine.startswith("<") and path in problems:
            what = problems[path]
        elif theirs is None:
            what = f"present here, absent in torch {version}"
        elif mine is None:
            what = f"absent here, present in torch {version}"
        elif entry["kind"] == "digest" and isinstance(mine, str) and not mine.startswith("<"):
            what = "its source differs"
        elif entry["kind"] == "digest":
            what = mine.strip("<>")
        else:
            what = f"{_show(mine)} here, {_show(theirs)} in torch {version}"
        out.append(f"{path} ({what})")
    return out


class Decision:
    def __init__(self, version: str, matched: bool, differs: List[str], warning: Optional[str],
                 restart_gate: Optional[str] = None):
        #: The known version whose behaviour is followed.
        self.version = version
        #: Whether every entry matched that version's.
        self.matched = matched
        self.differs = differs
        #: The one warning to log (allow_untested_torch), else None.
        self.warning = warning
        #: Why Dynamo's restart is never skipped on this torch, else None
        #: (``restart_skip_gate``).
        self.restart_gate = restart_gate


def decide(table: dict, observed: Dict[str, Any], problems: Dict[str, str],
           torch_version: str, allow_untested: bool) -> Decision:
    """Matches the observation against the table's versions.

    `problems`: entry → why its live object fails (live_problem); such an
    entry matches no version. Raises Refusal with the message to give."""
    entries = table["entries"]
    versions = table["versions"]
    seen = dict(observed)
    for path, why in problems.items():
        if seen.get(path) is not None:
            seen[path] = f"<{why}>"
    matches = [v for v, values in versions.items()
               if all(seen.get(p) == values.get(p) for p in entries)]
    if matches:
        exact = [v for v in matches if v == plain(torch_version)]
        chosen = exact[0] if exact else max(matches, key=lambda v: release(v) or ())
        return Decision(chosen, True, [], None, restart_skip_gate(table, seen))
    follow = nearest(torch_version, list(versions))
    differs = differences(seen, versions[follow], follow, entries, problems)
    tested = ", ".join(sorted(versions, key=lambda v: release(v) or ()))
    if not allow_untested:
        raise Refusal(
            f"compiler_collectives.torch was not tested with torch {torch_version}: it matches "
            f"none of the torch versions in its table ({tested}). Compared with torch {follow}, "
            f"the nearest: " + "; ".join(differs) + ". Nothing was changed. To run it anyway as "
            f"on torch {follow}, pass allow_untested_torch=True to enable() (on every rank)."
        )
    missing = []
    for path, entry in entries.items():
        if not entry.get("required"):
            continue
        if observed.get(path) is None:
            missing.append(f"{path} (absent)")
        elif path in problems and not problems[path].startswith("replaced at run time"):
            missing.append(f"{path} ({problems[path]})")
    if missing:
        raise Refusal(
            f"compiler_collectives.torch cannot run on torch {torch_version}, even with "
            f"allow_untested_torch=True: what it requires is missing or cannot be called as it "
            f"calls it: " + "; ".join(missing) + f". (Nearest tested torch: {follow}.) Nothing "
            "was changed."
        )
    warning = (
        f"compiler_collectives.torch: torch {torch_version} is untested "
        f"(allow_untested_torch=True); following torch {follow}, from which it differs in: "
        + "; ".join(differs)
    )
    return Decision(follow, False, differs, warning, restart_skip_gate(table, seen))
