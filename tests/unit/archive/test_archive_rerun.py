"""The manifest's reproducibility sections: software, environment, packages, data, seeds and
the rerun command line (``wrapper.archive.rerun``, ``wrapper.archive.jobenv``)."""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

from tests.support.archive import jobwrap, record, run_attempt, user_file
from wrapper import slurm
from wrapper.archive import archive_attempt, jobenv, rerun
from wrapper.config import Config, GpuConfig, PathsConfig, SlurmConfig
from wrapper.hooks.health import check_node
from wrapper.job import events as ev
from wrapper.job.state import JobState
from wrapper.job.store import JobStore
from wrapper.osl.users import UserIds
from wrapper.slurm.context import JobContext

HEALTHY = Path(__file__).resolve().parents[2] / "fixtures" / "gpu" / "healthy-4.toml"


def test_software_is_what_roots_version_checks_read_with_the_fake_probe(tmp_path: Path) -> None:
    cfg = Config(gpu=GpuConfig(backend="fake", fake_inventory=str(HEALTHY)),
                 paths=PathsConfig(state_dir=str(tmp_path)))
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "n1.json").write_text(json.dumps({"at": time.time(), "gpus": 4}))
    job = JobState(tmp_path, "7")
    job.prepare(os.getuid(), os.getgid())
    ctx = JobContext(hook="prolog", job_id="7", node="n1", user="root", uid=0, gid=0, gpus=[0])
    report = check_node(ctx, cfg, {}, phase="prolog", backend=slurm.backend(SlurmConfig()),
                        state=job)
    assert report.verdict == "pass"
    stack = rerun.software(JobStore(job).events())["n1"]
    assert (stack["driver"], stack["cuda"]) == ("550.54.15", "12.4")
    assert stack["checks"]["driver"] == "pass" and stack["phase"] == "prolog"
    assert stack["nccl"] is None and stack["attempt"] == 0


def test_version_rows_of_every_check_are_read_and_user_events_are_not() -> None:
    rows = [{"check": "nccl", "status": "fail",
             "reason": "NCCL 2.17.1 (/opt/nccl-2.18/lib/libnccl.so.2.17.1) is older than x"},
            {"check": "fabric_manager", "status": "pass",
             "reason": "nvidia-fabricmanager active, version 550.54.15"},
            {"check": "commands", "status": "pass", "reason": "python3.11 3.2.1 (>= 3.2)"},
            {"check": "commands", "status": "fail", "reason": "nvcc: was not found"}]
    events = [ev.Health(node="n2", versions=rows),
              ev.Health(node="n3", versions=rows, source="user")]
    found = rerun.software(events)
    assert list(found) == ["n2"]
    assert (found["n2"]["nccl"], found["n2"]["fabric_manager"]) == ("2.17.1", "550.54.15")
    assert found["n2"]["nccl_path"] == "/opt/nccl-2.18/lib/libnccl.so.2.17.1"
    assert found["n2"]["commands"] == {"python3.11": "3.2.1"}
    assert found["n2"]["checks"] == {"nccl": "fail", "fabric_manager": "pass",
                                     "commands": "fail"}


def test_claims_name_modules_container_envs_python_and_seeds(tmp_path: Path) -> None:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python3").write_text("#!/bin/sh\n")
    (bin_dir / "python3").chmod(0o755)
    env = {"LOADEDMODULES": "gcc/12.2:cuda/12.4::nccl/2.18", "_LMFILES_": "/m/gcc/12.2.lua",
           "APPTAINER_CONTAINER": "/images/pt.sif",
           "SLURM_SPANK__SLURM_SPANK_OPTION_pyxis_container_image": "nvcr.io/pt:24.01",
           "ENROOT_ROOTFS": "/tmp/enroot", "CONDA_PREFIX": "/opt/conda/envs/x",
           "CONDA_DEFAULT_ENV": "x", "VIRTUAL_ENV": str(tmp_path / "venv"),
           "PATH": f"/nonexistent:{bin_dir}:/usr/bin", "PYTHONHASHSEED": "0", "SEED": "1",
           "TORCH_SEED": "2", "SEEDLING": "no", "HOME": "/home/u", "SECRET_TOKEN": "x" * 5000}
    found = jobenv.claims(env)
    assert found["modules"] == ["gcc/12.2", "cuda/12.4", "nccl/2.18"]
    assert found["module_files"] == ["/m/gcc/12.2.lua"]
    assert found["container"] == {
        "APPTAINER_CONTAINER": "/images/pt.sif", "ENROOT_ROOTFS": "/tmp/enroot",
        "SLURM_SPANK__SLURM_SPANK_OPTION_pyxis_container_image": "nvcr.io/pt:24.01"}
    assert found["conda"] == {"prefix": "/opt/conda/envs/x", "env": "x"}
    assert found["venv"] == str(tmp_path / "venv")
    assert found["python"] == str(bin_dir / "python3")
    assert found["seeds"] == {"PYTHONHASHSEED": "0", "SEED": "1", "TORCH_SEED": "2"}
    assert "SECRET_TOKEN" not in json.dumps(found) and "HOME" not in json.dumps(found)
    assert jobenv.claims({}) == {"modules": [], "module_files": [], "container": {},
                                 "conda": None, "venv": None, "python": None, "seeds": {}}


def _venv(base: Path, user: UserIds) -> Path:
    """A venv-like prefix the user owns: dist-info, egg-info, a .pth that must never run,
    a FIFO in place of a METADATA, and a METADATA that links to a root-only file."""
    prefix = base / "env"
    site = prefix / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (prefix / "pyvenv.cfg").write_text("home = /usr/bin\n")
    good = site / "torch-2.3.0.dist-info"
    good.mkdir()
    (good / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.3.0+cu121\n"
                                   "\nVersion: 9.9.9\n")
    (site / "numpy-1.26.4.dist-info").mkdir()  # no METADATA: the folder's name
    (site / "six-1.16.0-py3.11.egg-info").write_text("Name: six\nVersion: 1.16.0\n")
    fifo = site / "hang-1.0.dist-info"
    fifo.mkdir()
    os.mkfifo(fifo / "METADATA")
    secret = base / "root-only"
    secret.write_text("Name: LEAKED\nVersion: 6.6.6\n")
    os.chmod(secret, 0o600)
    linked = site / "leak-2.0.dist-info"
    linked.mkdir()
    os.symlink(secret, linked / "METADATA")
    marker = base / "pth-ran"
    (site / "evil.pth").write_text(f"import os; open({str(marker)!r}, 'w').close()\n")
    conda = prefix / "conda-meta"
    conda.mkdir()
    (conda / "python-3.11.8-hab00c5b_0_cpython.json").write_text("{}")
    (conda / "history").write_text("")
    for path in [prefix, *prefix.rglob("*")]:
        os.lchown(path, user.uid, user.gid)
    return prefix


def test_packages_are_read_as_the_user_running_nothing_and_never_hanging(
        shared: Path, user: UserIds) -> None:
    prefix = _venv(shared, user)
    started = time.monotonic()
    found = jobenv.read_packages(user, {"venv": str(prefix)}, timeout=10)
    assert time.monotonic() - started < 10  # the FIFO was never opened for reading
    assert found["kind"] == "venv" and found["prefix"] == str(prefix)
    assert found["python_version"] == "3.11" and found["error"] == ""
    assert found["pip"] == ["hang==1.0", "leak==2.0", "numpy==1.26.4", "six==1.16.0",
                            "torch==2.3.0+cu121"]
    assert found["conda"] == ["python=3.11.8=hab00c5b_0_cpython"]
    assert "LEAKED" not in json.dumps(found)
    assert not (shared / "pth-ran").exists()


def test_the_interpreter_is_the_venv_then_conda_then_the_python_on_path(
        shared: Path, user: UserIds) -> None:
    assert jobenv.prefix_of({"venv": "/v", "conda": {"prefix": "/c"}}) == ("venv", "/v")
    assert jobenv.prefix_of({"conda": {"prefix": "/c"}, "python": "/p/bin/python3"}) == \
        ("conda", "/c")
    assert jobenv.prefix_of({"python": "/p/bin/python3"}) == ("python", "/p")
    assert jobenv.prefix_of({"python": "relative/python"}) is None
    missing = jobenv.read_packages(user, {}, timeout=5)
    assert missing["pip"] == [] and "not known" in missing["error"]
    private = shared / "private"
    private.mkdir(mode=0o700)
    denied = jobenv.read_packages(user, {"venv": str(private)}, timeout=5)
    assert denied["pip"] == [] and denied["error"] == f"no site-packages under {private}"


def test_a_staged_tree_has_the_cache_key_or_its_files_checksums() -> None:
    items = [{"directive": "a:b", "cache_key": "k" * 64, "files": 2},
             {"directive": "c:d", "checksums": {"x": "1", "y": "2"}},
             {"directive": "e:f"}]
    events = [ev.StagingIn(attempt=0, node=n, extra={"items": items}) for n in ("n1", "n2")]
    events.append(ev.StagingIn(attempt=0, source="user",
                               extra={"items": [{"directive": "forged", "cache_key": "f"}]}))
    found = rerun.data(events, 0)
    assert [(d["directive"], d["digest_kind"]) for d in found] == [
        ("a:b", "cache_key"), ("c:d", "files_sha256"), ("e:f", None)]
    same = rerun.tree_digest({"checksums": {"y": "2", "x": "1"}})
    assert found[1]["digest"] == same[0] and rerun.data(events, 1) == []


def test_the_rerun_command_replays_slurms_options_seeds_and_resume_point() -> None:
    slurm_info = {"JobName": "train run", "Partition": "gpu", "Account": "(null)",
                  "TimeLimit": "01:00:00", "NumNodes": "2", "NumTasks": "2", "CPUs/Task": "4",
                  "TresPerNode": "gres/gpu:1", "MinMemoryNode": "8G", "QOS": "normal"}
    made = rerun.command(job_id="9", slurm=slurm_info, work_dir="/w d",
                         script="/a/9/attempt-1/n1/batch-script.sh.gz",
                         seeds={"SEED": "3", "BAD_SEED": "1,2"}, resume_from="/ck/step-9",
                         attempt=1)
    words = shlex.split(made["command"])
    assert words[:3] == ["gzip", "-dc", "/a/9/attempt-1/n1/batch-script.sh.gz"]
    assert words[3:] == ["|", "sbatch", "--job-name=train run", "--partition=gpu", "--qos=normal",
                         "--time=01:00:00", "--nodes=2", "--ntasks=2", "--cpus-per-task=4",
                         "--gres=gpu:1", "--mem=8G", "--chdir=/w d",
                         "--export=ALL,SEED=3,JOBWRAP_RESUME_FROM=/ck/step-9"]
    assert any("BAD_SEED" in n for n in made["notes"])
    json_record = rerun.command(job_id="9", slurm={"ReqTRES": "cpu=2,node=2,gres/gpu=4",
                                                   "MinMemoryNode": "0"},
                                work_dir=None, script="s.gz", seeds={}, resume_from=None,
                                attempt=0)
    assert json_record["options"] == ["--nodes=2", "--gpus=4"]
    none = rerun.command(job_id="9", slurm={}, work_dir=None, script=None, seeds={},
                         resume_from=None, attempt=0)
    assert none["command"] is None and "not in the archive" in none["notes"][0]
    ended = [ev.AttemptEnd(attempt=0, checkpoint_path="/ck/step-5"),
             ev.AttemptEnd(attempt=0, source="user", checkpoint_path="/forged")]
    assert rerun.resume_point(ended, 1) == "/ck/step-5" and rerun.resume_point(ended, 0) is None


def test_the_archived_manifest_has_every_section_and_show_rerun_prints_it(
        shared: Path, user: UserIds, cfg: Config, job: JobState, work: Path,
        config_path: str) -> None:
    prefix = _venv(shared, user)
    user_file(work / "job-42.out", user, "hi\n")
    rec = record(shared, user, nodes=["n1"])
    run_attempt(job, 0, ["n1"], kind="hang", decision="requeue", checkpoints=(5,))
    job.append("health", node="n1", attempt=1, phase="prolog", verdict="pass", failures=[],
               warnings=[], versions=[{"check": "driver", "status": "pass",
                                       "reason": "driver 550.54.15 (no baseline set)"}])
    job.append("staging.in", node="n1", attempt=1,
               items=[{"directive": "/data:d", "cache_key": "c" * 64}])
    job.append("task-prolog.context", as_user=True, node="n1", attempt=1, step="0",
               environment=jobenv.claims({"VIRTUAL_ENV": str(prefix), "SEED": "11",
                                          "LOADEDMODULES": "cuda/12.4"}))
    run_attempt(job, 1, ["n1"], checkpoints=(9,))
    archive_attempt(cfg, job, rec, attempt=1, node="n1", script_text="#!/bin/sh\n",
                    extra={"slurm": {"JobName": "train", "NumNodes": "1"}})
    archive = shared / "archive" / user.name / "42"
    manifest = json.loads((archive / "manifest.json").read_text())
    assert manifest["software"]["n1"]["driver"] == "550.54.15"
    assert manifest["environment"]["source"] == "user"
    assert manifest["environment"]["modules"] == ["cuda/12.4"]
    assert "torch==2.3.0+cu121" in manifest["python"]["pip"]
    assert manifest["data"] == [{"directive": "/data:d", "source": None, "dest": None,
                                 "files": None, "bytes": None, "digest": "c" * 64,
                                 "digest_kind": "cache_key", "node": "n1"}]
    assert manifest["seeds"] == {"SEED": "11"}
    command = manifest["rerun"]["command"]
    assert command.startswith(f"gzip -dc {archive}/attempt-1/n1/batch-script.sh.gz | sbatch ")
    assert "JOBWRAP_RESUME_FROM=/ckpt/step-5" in command and "SEED=11" in command
    code, out = jobwrap(config_path, "archive", "show", "42", "--rerun")
    assert (code, out) == (0, command + "\n")
    code, out = jobwrap(config_path, "archive", "show", "42")
    assert "software n1: driver 550.54.15" in out and f"rerun {command}" in out
    code, out = jobwrap(config_path, "archive", "show", "42", "--rerun", "--attempt", "7")
    assert code == 2 and "no attempt 7" in out


def test_rerun_of_an_earlier_attempt_names_its_own_script(archived: str) -> None:
    code, out = jobwrap(archived, "archive", "show", "42", "--rerun", "--attempt", "0")
    assert code == 0 and out.startswith("gzip -dc ") and "attempt-0/n1/batch-script" in out


def test_claims_read_back_are_filtered_as_at_the_source() -> None:
    from wrapper.archive.jobenv import sanitize

    forged = {"modules": ["ok", 3, "x" * 5000], "seeds": {"SEED": "1", "BASH_ENV": "/x",
                                                        "A_SEED": "$(id)"},
              "container": {"LD_PRELOAD": "/e.so", "APPTAINER_NAME": "img"},
              "conda": {"prefix": 5}, "venv": ["/v"], "python": "/usr/bin/python3",
              "anything": "else"}
    clean = sanitize(forged)
    assert set(clean) == {"modules", "module_files", "container", "conda", "venv", "python",
                          "seeds"}
    assert clean["modules"] == ["ok", "x" * 1024] and clean["seeds"] == {"SEED": "1"}
    assert clean["container"] == {"APPTAINER_NAME": "img"}
    assert clean["conda"] is None and clean["venv"] is None


def test_the_rerun_line_exports_only_seeds() -> None:
    made = rerun.command(job_id="9", slurm={}, work_dir=None, script="s.gz", attempt=0,
                         seeds={"SEED": "3", "BASH_ENV": "/home/u/x.sh",
                                "LD_PRELOAD": "/tmp/e.so"}, resume_from=None)
    assert "--export=ALL,SEED=3" in made["options"], made
    assert "BASH_ENV" not in made["command"] and "LD_PRELOAD" not in made["command"]
