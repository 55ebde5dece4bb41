"""The pulse: a lost node noticed in seconds, whatever Slurm's ``SlurmdTimeout`` says.

Slurm marks a node DOWN only after ``SlurmdTimeout`` (300 s by default, the value sites
run) and NCCL's ranks on the other nodes wait 10 minutes in their collective. The node
watchers jobwrap already runs (root, one per node and attempt, wrapper/watch/) beat to
the watcher of the job's first node, the *hub*, over one TCP connection each, every
``[pulse] interval`` (0.5 s). Both ends prove they are root and belong to this job's
attempt with a MUNGE credential (wrapper/pulse/munge.py), so no unauthenticated port is
opened and no user can speak for root.

- A node whose connection stays open and silent for ``lost_after`` (4.5 s) is lost
  (wrapper/pulse/hub.py). A watcher frozen 3 s, a node whose CPUs the job starves (the
  beat threads run at a raised priority) or whose disks stall (the beat touches no disk)
  keeps beating.
- A node that hears no ack for ``lost_after`` fences itself: it kills the job's processes
  on itself (wrapper/pulse/beat.py). The hub acts only ``fence_grace`` later, once that
  lease has surely run out, by setting the lost node DOWN in Slurm; Slurm then ends the
  job's work there and the usual paths move it (a spare under ``jobwrap run
  --spare-nodes``, else the epilog's requeue that excludes the node).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from wrapper.fastdataclass import dataclass

if TYPE_CHECKING:
    from wrapper.pulse.munge import Credential


class Signer(Protocol):
    def encode(self, payload: bytes) -> bytes: ...
    def decode(self, cred: bytes) -> Credential: ...


@dataclass(frozen=True)
class Settings:
    interval: float = 0.5
    lost_after: float = 4.5
    fence_grace: float = 2.0
    ports: tuple[int, int] = (7400, 7599)
