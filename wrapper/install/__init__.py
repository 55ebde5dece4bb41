"""``jobwrap install`` and ``jobwrap uninstall``: one command per node role.

``plan`` works out every file and folder a role needs (the hooks, their settings, the
config, the folders, slurm.conf's lines, job_submit.lua, the systemd units) and what each
holds now; ``apply`` writes the differences atomically and keeps a record of them beside
the hooks (``<prefix>/install.json``); ``uninstall`` reads that record and puts back what
was there before. Nothing here runs on a job's path.
"""
