"""Restarting a failed attempt, as four steps with one owner each.

``evidence.gather`` does all the I/O (Slurm's record, the job's output tail as the user,
root's events and the supervisor's facts, the checkpoints as the user); ``classify`` and
``policy`` are pure (what ended the attempt; whether to requeue); ``apply`` acts
(requeue, release, tell the job); ``resume`` owns the latest-checkpoint lookup and the
JOBWRAP_* exports shared by the task-prolog, ``jobwrap run`` and the supervisor.
"""
