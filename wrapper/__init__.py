"""jobwrap: a Slurm prolog/epilog and per-job supervisor for GPU clusters."""

__version__ = "0.1.0"
