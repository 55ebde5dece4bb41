"""One line of jobwrap's in the job's own output file, written with the user's rights.

Root's hooks tell the researcher what happened where they look (the job's ``--output``):
the attempt's end and what follows, a hang's stuck rank, a slow node, results kept on a
node. The file is the user's, so it is opened as the user (``call_as``: never following a
link the user planted into a file root owns), bounded in time; a line that cannot be
written is logged, never fails the hook.
"""

from __future__ import annotations

from typing import Any

USER_IO_TIMEOUT = 10.0  # seconds the write may take (the file may be on a stalled mount)


def tell(stdout: str, user: Any, message: str, *, event: str = "epilog.output_unwritable",
         timeout: float = USER_IO_TIMEOUT) -> bool:
    """Append ``message`` to ``stdout`` as ``user``; False (and a warning ``event``) when it
    could not be written, or there is no output file."""
    if not stdout:
        return False
    from wrapper import log
    from wrapper.errors import JobwrapError
    from wrapper.osl.child import call_as
    from wrapper.osl.files import append_text_line

    try:
        call_as(user, append_text_line, stdout, message, timeout=timeout)
    except JobwrapError as exc:
        log.get().warning(event, error=str(exc))
        return False
    return True
