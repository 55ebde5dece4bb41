"""``python -m wrapper`` is ``jobwrap``."""

from wrapper.entry import main

main()
