"""Checkpoint discovery: the newest *complete* checkpoint in a directory, and why not newer ones.

Public API::

    latest_valid(directory, *, glob=None, marker=None, settle_seconds=10.0, now=None)
        -> Discovery(latest: Checkpoint | None, skipped: list[Skipped], layout: str | None)

Layouts recognised without configuration (each in ``layouts/``; the table in
docs/checkpoints.md): PyTorch Lightning, Accelerate ``save_state``,
Hugging Face Trainer, DeepSpeed, Megatron-LM, torch.distributed.checkpoint and plain
``torch.save`` files; with ``glob`` (and an optional ``marker``) only the generic
layout is used (its rule: ``layouts/generic.py``).

Rules, in the order they are applied to each candidate, newest first:

1. Order: by the step (or other number) the layout reads in the names, within one
   family of names; families (``last.ckpt`` beside ``epoch=E-step=S.ckpt``, names with
   different prefixes) are merged by modification time; names without a number are
   ordered by modification time. Checks start at the newest and stop at the first
   candidate that passes; ``Discovery.skipped`` holds every newer one that failed.
2. A temporary name (``*.tmp``, ``*.partial``, ``*.incomplete``, ``*~``, hidden ``.*``,
   ``tmp*``) whose remainder a layout recognises is rejected: "temporary name".
3. A symlink leading outside the directory is rejected without being followed.
4. The layout's own completeness check: a zip end record for single-file checkpoints,
   a completion file (``trainer_state.json``, ``.metadata``, a marker) for directories,
   a pointer file (DeepSpeed ``latest``, Megatron's tracker) naming a tag that exists.
5. Settling: anything modified less than ``settle_seconds`` before ``now`` (the
   candidate or its completion evidence) is still being written, and rejected.

Nothing is ever written, and a checkpoint's contents are never read beyond a zip's
last 64 KiB + 22 bytes and small pointer files. A missing or unreadable directory is an
answer (``latest=None`` and a Skipped saying why), never an exception.
"""

from __future__ import annotations

from wrapper.checkpoints.discover import latest_valid
from wrapper.checkpoints.records import Checkpoint, Discovery, Skipped

__all__ = ["Checkpoint", "Discovery", "Skipped", "latest_valid"]
