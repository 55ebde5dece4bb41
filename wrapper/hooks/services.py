"""What a hook body reaches outside itself (``Services``), apart from the frame that
dispatches to the hooks (``wrapper.hooks``), which the hook modules need not import."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import field
from typing import TYPE_CHECKING

from wrapper.config import Config
from wrapper.fastdataclass import dataclass

if TYPE_CHECKING:
    from wrapper.gpu.probe import Probe
    from wrapper.runner import Runner
    from wrapper.slurm import SlurmBackend


@dataclass
class Services:
    """What a hook body reaches outside itself, built once by ``run_hook``.

    Each is made on first use (the task-prolog never pays for a Slurm backend). Unit
    tests pass fakes: ``wrapper.slurm.fake.FakeSlurm``, a GPU probe factory (the ``fake``
    probe, through the same seam NVML uses), a GPU confirmer, a spawner that records what
    it would start, a clock.
    """

    cfg: Config
    slurm_factory: Callable[[], SlurmBackend] | None = None
    # The external-command gateway of the Slurm backend and the checks; None: a plain one.
    runner: Runner | None = None
    # The GPU probe of a node (its Slurm name); None: ``[gpu] backend`` (wrapper.gpu.backend).
    probe_factory: Callable[[str], Probe] | None = None
    # Root's own probe of GPUs (node, indexes) -> faults; None: the configured probe.
    gpu_confirm: Callable[[str, Sequence[int]], list[str]] | None = None
    # Starts a detached ``jobwrap ...`` (argv); None: wrapper.detach with the hook's env.
    spawn: Callable[[Sequence[str]], object] | None = None
    clock: Callable[[], float] = time.monotonic
    _slurm: SlurmBackend | None = field(default=None, repr=False)

    @property
    def slurm(self) -> SlurmBackend:
        if self._slurm is None:
            if self.slurm_factory is not None:
                self._slurm = self.slurm_factory()
            else:
                from wrapper import slurm

                self._slurm = slurm.backend(self.cfg.slurm, self.runner)
        return self._slurm

    def open_probe(self, node: str) -> Probe:
        """This node's GPU probe (the caller closes it)."""
        if self.probe_factory is not None:
            return self.probe_factory(node)
        from wrapper.gpu.backend import open_probe

        return open_probe(self.cfg.gpu, node)
