"""The one staging error that is not the user's fault: jobwrap could not stage safely; and
how an error names the directive it is about."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from wrapper.errors import JobwrapError, UserInputError


class StagingError(JobwrapError):
    """Staging failed for a reason other than the user's input.

    An unsafe scratch or cache folder (a symlink, a foreign owner), a worker that died or
    ran out of time, a disk error. A user's mistake (a missing source, an escaping DEST,
    data that does not fit) is a :class:`wrapper.errors.UserInputError` instead.
    """


class NoSpaceError(UserInputError):
    """A write found its disk full (ENOSPC) or its quota used (EDQUOT). In the job's
    scratch that is the job's data not fitting; in the node cache it is the cache's
    problem, and the data is staged without it (``wrapper.staging.cache``)."""


def prefixed(directive: str, exc: JobwrapError) -> str:
    """The error's message, starting with the directive it is about."""
    text = str(exc)
    return text if text.startswith(directive) else f"{directive}: {text}"


@contextlib.contextmanager
def about(directive: str) -> Iterator[None]:
    """Errors raised inside name ``directive`` first; the user's stay the user's."""
    try:
        yield
    except UserInputError as exc:
        raise UserInputError(prefixed(directive, exc)) from None
    except StagingError as exc:
        raise StagingError(prefixed(directive, exc)) from None
