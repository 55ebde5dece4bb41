"""Compatibility names for the OS-safety layer (``wrapper.osl``), where the code now lives.

``as_user`` is ``wrapper.osl.child.call_as``: a forked child with the user's rights, a
hard deadline and a bounded result. New code imports from ``wrapper.osl`` directly.
"""

from __future__ import annotations

from wrapper.osl.child import AsUserTimeout as AsUserTimeout
from wrapper.osl.child import call_as as as_user
from wrapper.osl.files import read_tail_text as read_tail
from wrapper.osl.users import AsUserError as AsUserError
from wrapper.osl.users import UserIds as UserIds
from wrapper.osl.users import drop_to as drop_to

__all__ = ["AsUserError", "AsUserTimeout", "UserIds", "append_line", "as_user", "drop_to",
           "read_tail"]


def append_line(path: str, line: str) -> bool:
    """Append one line to an existing regular file (the job's output); False if absent."""
    from wrapper.osl.files import append_line as _append

    return _append(path, line.rstrip("\n").encode()) == "ok"
