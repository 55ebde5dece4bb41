"""jobwrap's benchmarks: each compares against an anchor measured in the same run."""
