"""The OS-safety layer: every root path that touches what a job's user controls goes here.

Audit this package, and the rest of jobwrap only has to be read for *which* primitive it
calls. Its modules, no third-party code:

``users``  who a job's user is (``UserIds``) and how a process becomes them for good
           (``drop_to``: groups, gid, uid, proof that root cannot be had back;
           ``not_dumpable``: the user's other processes cannot ptrace it).
``child``  the one run-as-user engine. ``fork_as`` forks a child that resets the hook's
           signal handlers, closes every inherited descriptor but the ones it is given,
           drops to the user, marks itself non-dumpable and runs a body; the parent holds
           a hard deadline after which it SIGKILLs the child by pid and reaps it.
           ``call_as`` runs one function that way and brings back its JSON result,
           bounded in size; a child past its deadline is an ``AsUserTimeout``; with
           ``alarm`` the child also ends itself on a timer nobody catches.
``files``  safe file primitives for paths under a folder a user can write: opens that
           never follow a final symlink and never block (``O_NOFOLLOW | O_NONBLOCK``, then
           fstat: anything but a regular file, a FIFO or a device, is refused), bounded
           tail reads, atomic replace (tmp + fsync + rename, with a mode), a capped,
           locked ``O_APPEND`` line append, a private mkdir that checks the owner, the
           one owner/mode check of what root trusts (``owned_alone``: its owner's to
           write, nobody else's), and a chown by descriptor only.
``dirs``   folders through descriptors, one component at a time: the no-follow
           ``open_dir`` relative to a parent (``follow=True`` only where a path may go
           through symlinks by right), ``make_dir``, ``entries``, ``tree_size``,
           ``sync_tree``, ``DirTree`` (a tree opened or made on demand), ``first_missing``,
           and the one ``remove_tree``: no symlink followed, no mount crossed.

Rules every caller keeps: a path the user controls is opened with the user's rights
(``call_as``) or, when root must, with the ``files`` and ``dirs`` primitives below a
root-owned folder; every read is bounded; every wait has a deadline.
"""
