"""The login-node guard: keeps training, inference and heavy compute off login nodes.

One concept per module: ``rules`` (what breaks the rules, pure), ``scan`` (what runs,
through psutil, cheaply), ``gpu`` (which pids use a GPU: the seam to the GPU probe),
``actions`` (warn, throttle, terminate), ``state`` (violation clocks and the audit
trail on disk), ``guard`` (one scan cycle and the escalation ladder) and ``cli``.
"""
