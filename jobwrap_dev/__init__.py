"""What a developer of jobwrap uses and a node never runs: the local Slurm cluster the
tests and the demo run on (``sandbox``), the events reference's generator
(``eventsdoc``). Kept out of the ``wrapper`` package, so the wheel an admin installs on
every node holds only what a node runs; run from a checkout:
``python -m jobwrap_dev sandbox up|down|status|demo``."""
