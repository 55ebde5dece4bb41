"""``python -m wrapper`` is ``jobwrap``."""

from wrapper.cli import main

main()
