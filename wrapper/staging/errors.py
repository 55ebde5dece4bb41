"""The one staging error that is not the user's fault: jobwrap could not stage safely."""

from __future__ import annotations

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
