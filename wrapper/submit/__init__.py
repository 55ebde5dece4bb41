"""The submit side, in one place: the ``#JOBWRAP`` directives and the job's options
(``directives``, read by root's hooks and ``jobwrap run`` alike), and Slurm's
``job_submit.lua`` plugin that checks them at submit (``job_submit.lua``, installed with
the site's defaults by ``jobwrap install-lua``: ``lua``). Imports nothing of its own
here: the prolog reads the directives without loading the installer."""
