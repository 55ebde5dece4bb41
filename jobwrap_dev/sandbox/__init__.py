"""A real local Slurm cluster for the tests and for people trying jobwrap."""
