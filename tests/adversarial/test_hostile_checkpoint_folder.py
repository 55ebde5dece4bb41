"""Root's resume lookup, attacked by the job's user through their own checkpoint folder.

On a requeued attempt's first node root's prolog runs ``resume.choose``: it looks up the
latest valid checkpoint in the user's ``--checkpoint-dir`` with the user's rights (a
child of ``osl.child.call_as``, under a deadline) and records root's ``resume.chosen``,
which the task-prolog exports as JOBWRAP_RESUME_FROM and the epilog judges. The user
controls that folder and may append to their own ``user-events.jsonl``, so they plant:
a FIFO named like a newer checkpoint, a symlink to something only root may read, a
folder of 20,000 look-alikes, and a forged ``resume.chosen`` line.

What an admin relies on: the lookup never hangs the prolog (it returns within its
timeout), never opens a FIFO for reading nor anything through a link the user cannot
follow, never puts root's content in an event or the job's output, never records a
choice the user could not read, and root's decisions take only root's events.
"""

from __future__ import annotations

import io
import os
import shutil
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwrap_dev.sandbox.cluster import Cluster
from wrapper.job import events as ev
from wrapper.job.record import JobRecord
from wrapper.job.state import JobState
from wrapper.job.store import JobStore
from wrapper.osl.child import call_as
from wrapper.osl.users import UserIds
from wrapper.restart.resume import Found, choose, latest_as
from wrapper.submit.directives import JobOptions

SECRET = "ROOT-ONLY-7c1e9a"  # what root keeps where the user may not look
TIMEOUT = 10.0  # choose()'s own default


def complete_zip(text: str = "w") -> bytes:
    """A complete zip archive, as every torch.save file is."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        archive.writestr("data.pkl", text)
    return buf.getvalue()


def give(user: UserIds, *paths: Path) -> None:
    for path in paths:
        os.chown(path, user.uid, user.gid, follow_symlinks=False)


@pytest.fixture
def ckdir(shared: Path, user: UserIds) -> Path:
    """The user's own checkpoint folder (0700, theirs)."""
    path = shared / "ckpt"
    path.mkdir(mode=0o700)
    give(user, path)
    return path


def put(user: UserIds, path: Path, data: bytes, mtime: float = 1000.0) -> Path:
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))
    give(user, path)
    return path


def pick(shared: Path, user: UserIds, ckdir: Path, *, glob: str | None = None,
         marker: str | None = None) -> tuple[Found | None, list[ev.ResumeChosen], float]:
    """Root's prolog on attempt 1's first node: choose(), timed; root's resume.chosen."""
    state = JobState(shared / "state", "71")
    state.prepare(user.uid, user.gid)
    options = JobOptions(checkpoint_dir=str(ckdir), checkpoint_glob=glob,
                         checkpoint_marker=marker)
    record = JobRecord(job_id="71", user=user.name, uid=user.uid, gid=user.gid, nodes=["n1"],
                       gpus=[], work_dir=str(shared), options=options.as_dict())
    store = JobStore(state)
    start = time.monotonic()
    found = choose(store, record, attempt=1, node="n1", timeout=TIMEOUT)
    took = time.monotonic() - start
    return found, [e for e in store.root_events() if isinstance(e, ev.ResumeChosen)], took


def _open_and_read(path: str) -> int:
    with open(path, "rb") as fh:
        return len(fh.read(1))


# (glob, the FIFO's name, the real checkpoint's name, what root must pick)
FIFOS = [("step_*", "step_999", "step_5", "step_5"),
         (None, "model_step999.pt", "model_step5.pt", "model_step5.pt"),
         # DeepSpeed's pointer as a FIFO: no tag is known complete, so none is picked
         (None, "latest", "global_step5", None)]


@pytest.mark.parametrize(("glob", "fifo", "real", "expect"), FIFOS)
def test_a_fifo_named_like_a_checkpoint_neither_blocks_nor_is_read(
        shared: Path, user: UserIds, ckdir: Path, glob: str | None, fifo: str, real: str,
        expect: str | None) -> None:
    if real.startswith("global_step"):
        (ckdir / real).mkdir()
        give(user, ckdir / real)
        put(user, ckdir / real / "mp_rank_00_model_states.pt", complete_zip())
    else:
        put(user, ckdir / real, complete_zip())
    os.mkfifo(ckdir / fifo, 0o600)
    give(user, ckdir / fifo)
    # No writer: a blocking open(O_RDONLY) of it would hang until the deadline.
    found, chosen, took = pick(shared, user, ckdir, glob=glob)
    assert took < TIMEOUT / 2, f"the lookup waited {took:.1f} s on the FIFO"
    assert (found.path if found else None) == (str(ckdir / expect) if expect else None)
    assert [e.path for e in chosen] == ([str(ckdir / expect)] if expect else [])
    # With data waiting in it: whatever the lookup does, the data must still be there.
    fd = os.open(ckdir / fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        os.write(fd, SECRET.encode())
        again = latest_as(user, str(ckdir), JobOptions(checkpoint_glob=glob), timeout=TIMEOUT)
        assert again == found
        assert os.read(fd, 100) == SECRET.encode(), "the lookup read from the FIFO"
    finally:
        os.close(fd)


@pytest.fixture
def vault() -> Iterator[Path]:
    """A root-only folder outside the user's reach, holding a perfectly valid checkpoint."""
    path = Path("/var/tmp") / f"jobwrap-vault-{os.getpid()}"
    path.mkdir(mode=0o700)
    (path / "model_step999.pt").write_bytes(complete_zip(SECRET))
    yield path
    shutil.rmtree(path)


@pytest.mark.parametrize("where", ["outside", "root-dir", "inside"])
def test_a_symlink_to_roots_files_is_never_chosen_and_leaks_nothing(
        shared: Path, user: UserIds, ckdir: Path, vault: Path, where: str,
        capfd: pytest.CaptureFixture[str]) -> None:
    put(user, ckdir / "model_step5.pt", complete_zip())
    if where == "outside":  # a link out of the folder, to a checkpoint root keeps
        target = str(vault / "model_step999.pt")
    elif where == "root-dir":
        target = "/root"
    else:  # inside the folder, but through a root-only 0700 folder there
        inner = ckdir / "vault"
        shutil.copytree(vault, inner)
        os.chmod(inner, 0o700)
        target = "vault/model_step999.pt"
    os.symlink(target, ckdir / "model_step999.pt")
    give(user, ckdir / "model_step999.pt")  # the user's own plant
    found, chosen, _ = pick(shared, user, ckdir)
    assert found is not None and found.path == str(ckdir / "model_step5.pt"), found
    assert [e.path for e in chosen] == [found.path]
    # whatever root recorded, the user can read it themselves
    assert call_as(user, _open_and_read, chosen[0].path, timeout=TIMEOUT) == 1
    said = capfd.readouterr()
    state = shared / "state" / "jobs" / "71"
    kept = "".join(p.read_text() for p in state.iterdir() if p.is_file())
    for text in (said.out, said.err, kept):
        assert SECRET not in text
        assert str(vault) not in text or where == "outside"


@pytest.mark.parametrize(("glob", "marker", "name", "real"), [
    (None, None, "model_step{}.pt", "model_step3.pt"),  # each an empty, cut torch file
    ("step_*", ".done", "step_{}", "step_3"),  # each without its completion marker
])
def test_twenty_thousand_look_alikes_keep_the_lookup_bounded(
        shared: Path, user: UserIds, ckdir: Path, glob: str | None, marker: str | None,
        name: str, real: str, capfd: pytest.CaptureFixture[str]) -> None:
    put(user, ckdir / real, complete_zip(), mtime=500.0)
    if marker:
        put(user, ckdir / (real + marker), b"", mtime=500.0)
    for i in range(10, 20_010):  # all newer, by name, than the real one
        path = ckdir / name.format(i)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        os.chown(path, user.uid, user.gid)
    found, chosen, took = pick(shared, user, ckdir, glob=glob, marker=marker)
    assert took < TIMEOUT + 2, f"root's prolog waited {took:.1f} s"
    said = capfd.readouterr()
    assert "Traceback" not in said.out + said.err
    if found is None:  # out of time: said plainly, nothing recorded
        assert "prolog.checkpoints_unreadable" in said.out + said.err and chosen == []
    else:
        assert found.path == str(ckdir / real) and [e.path for e in chosen] == [found.path]


FORGE = """#!/bin/bash
#SBATCH --output={work}/rforge-%j.out
#SBATCH --open-mode=append
#JOBWRAP --checkpoint-dir={ck} --checkpoint-glob=step_* --max-restarts=1
echo "attempt=$JOBWRAP_ATTEMPT resume=${{JOBWRAP_RESUME_FROM:-none}}"
[ "$JOBWRAP_ATTEMPT" = 0 ] || exit 0
mkdir -p {ck}
echo one > {ck}/step_1
echo two > {ck}/step_2
# root's pick for the next attempt, forged: an older checkpoint, later than root's own
printf '{{"ts":%s,"event":"resume.chosen","source":"root","attempt":1,"node":"%s",'\
'"hook":"prolog","path":"%s","step":1,"mtime":0,"passed_over":[]}}\\n' \\
  "$(( $(date +%s) + 3600 ))" "$SLURMD_NODENAME" {ck}/step_1 \\
  >> {state}/jobs/$SLURM_JOB_ID/user-events.jsonl
exit 1
"""


def test_a_forged_resume_pick_is_not_exported(cluster: Cluster) -> None:
    ck = cluster.work / "ckpt-rforge"
    shutil.rmtree(ck, ignore_errors=True)
    job_id = cluster.submit(FORGE.format(work=cluster.work, ck=ck, state=cluster.state_in_script),
                            name="rforge.sh")
    info = cluster.wait_job(job_id, timeout=180,
                            states={"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"})
    output = (cluster.work / f"rforge-{job_id}.out").read_text()
    events = cluster.events(job_id)
    forged = [e for e in events if e["event"] == "resume.chosen" and e["source"] == "user"]
    assert [e["path"] for e in forged] == [str(ck / "step_1")], events  # it was in place
    chosen = [(e["attempt"], e["path"]) for e in events
              if e["event"] == "resume.chosen" and e["source"] == "root"]
    assert chosen == [(1, str(ck / "step_2"))], events
    assert f"attempt=1 resume={ck}/step_2\n" in output, output
    assert f"resuming from {ck}/step_2" in output, output
    ends = [(e["attempt"], e["kind"], e["decision"]) for e in events
            if e["event"] == "attempt.end" and e["source"] == "root"]
    assert ends == [(0, "user_error", "requeue"), (1, "success", "done")], (ends, output)
    assert not [e for e in events if e["event"] == "checkpoint.suspect"], events
    assert info["JobState"] == "COMPLETED", output
