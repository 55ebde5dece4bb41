"""Content checks on checkpoints the real frameworks write, damaged as a crash leaves them.

The frameworks (torch 2.13 CPU, transformers, accelerate, lightning) run once per test
session from the framework venv (tools/bootstrap makes it), writing into a temporary
folder; each test copies the layout it needs and damages the copy. DeepSpeed and
Megatron are not installed: their folder layouts are built here as they write them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import framework_python
from tests.support.checkpoints import NOW, OLD, name_of, reasons, zip_bytes
from tests.support.checkpoints import find as find_settled
from wrapper.checkpoints import Discovery
from wrapper.checkpoints.dcpmeta import storage_extents

WRITER = Path(__file__).resolve().parents[2] / "fixtures" / "frameworks" / "write_checkpoints.py"


@pytest.fixture(scope="session")
def written() -> Iterator[Path]:
    out = Path(tempfile.mkdtemp(prefix="jobwrap-frameworks-"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([framework_python(), str(WRITER), str(out)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    yield out
    shutil.rmtree(out)


def copy(written: Path, name: str, dest: Path) -> Path:
    """A settled copy of one framework's output."""
    target = dest / name
    shutil.copytree(written / name, target)
    for folder, dirs, files in os.walk(target):
        for entry in (*dirs, *files):
            os.utime(os.path.join(folder, entry), (OLD, OLD))
    os.utime(target, (OLD, OLD))
    return target


def find(root: Path) -> Discovery:
    """Discovery, once the folders the damage touched (an unlink) are settled again."""
    for folder, _dirs, _files in os.walk(root):
        os.utime(folder, (OLD, OLD))
    return find_settled(root)


def cut(path: Path, keep: float = 0.5) -> None:
    """Cut a file short, as a node losing its page cache leaves it, and keep it settled."""
    size = path.stat().st_size
    os.truncate(path, int(size * keep))
    os.utime(path, (OLD, OLD))


# -- Hugging Face Trainer -----------------------------------------------------------------
def test_hf_trainer_checkpoints_are_complete(written: Path, tmp_path: Path) -> None:
    found = find(copy(written, "hf", tmp_path))
    assert name_of(found) == "checkpoint-4" and found.skipped == []


def test_hf_model_safetensors_cut_short_falls_back(written: Path, tmp_path: Path) -> None:
    root = copy(written, "hf", tmp_path)
    cut(root / "checkpoint-4" / "model.safetensors")
    found = find(root)
    assert name_of(found) == "checkpoint-2"
    assert reasons(found)["checkpoint-4"].startswith("model.safetensors: truncated")


def test_hf_optimizer_cut_short_falls_back(written: Path, tmp_path: Path) -> None:
    root = copy(written, "hf", tmp_path)
    cut(root / "checkpoint-4" / "optimizer.pt", 0.9)
    found = find(root)
    assert name_of(found) == "checkpoint-2"
    assert reasons(found)["checkpoint-4"].startswith("optimizer.pt: truncated")


def test_hf_missing_weights_are_rejected(written: Path, tmp_path: Path) -> None:
    root = copy(written, "hf", tmp_path)
    (root / "checkpoint-4" / "model.safetensors").unlink()
    assert reasons(find(root))["checkpoint-4"].startswith("no model weights")


def test_hf_sharded_checkpoint_checks_every_shard(written: Path, tmp_path: Path) -> None:
    root = copy(written, "hf_sharded", tmp_path)
    shards = sorted((root / "checkpoint-7").glob("model-*.safetensors"))
    assert len(shards) > 1  # the writer split the weights
    assert name_of(find(root)) == "checkpoint-7"
    cut(shards[-1], 0.7)
    assert reasons(find(root))["checkpoint-7"].startswith(f"{shards[-1].name}: truncated")
    shards[-1].unlink()
    assert reasons(find(root))["checkpoint-7"].startswith(
        "model.safetensors.index.json names 1 shard(s) that are missing")


def test_hf_index_cut_short_is_rejected(written: Path, tmp_path: Path) -> None:
    root = copy(written, "hf_sharded", tmp_path)
    cut(root / "checkpoint-7" / "model.safetensors.index.json")
    assert reasons(find(root))["checkpoint-7"] == \
        "model.safetensors.index.json is not JSON (cut short?)"


def test_safetensors_with_trailing_bytes_is_corrupt(written: Path, tmp_path: Path) -> None:
    root = copy(written, "hf", tmp_path)
    weights = root / "checkpoint-4" / "model.safetensors"
    with weights.open("ab") as f:
        f.write(b"\0" * 10)
    os.utime(weights, (OLD, OLD))
    assert "the header accounts for" in reasons(find(root))["checkpoint-4"]


# -- torch.distributed.checkpoint ---------------------------------------------------------
def test_dcp_complete_steps(written: Path, tmp_path: Path) -> None:
    root = copy(written, "dcp", tmp_path)
    assert name_of(find(root)) == "step_20"
    extents = storage_extents((root / "step_20" / ".metadata").read_bytes())
    assert extents == {"__0_0.distcp": (root / "step_20" / "__0_0.distcp").stat().st_size}


def test_dcp_shard_cut_short_falls_back(written: Path, tmp_path: Path) -> None:
    root = copy(written, "dcp", tmp_path)
    cut(root / "step_20" / "__0_0.distcp", 0.9)
    found = find(root)
    assert name_of(found) == "step_10"
    assert reasons(found)["step_20"].startswith("shard __0_0.distcp is cut short")


def test_dcp_shard_missing_is_rejected(written: Path, tmp_path: Path) -> None:
    root = copy(written, "dcp", tmp_path)
    (root / "step_20" / "__0_0.distcp").unlink()
    assert reasons(find(root))["step_20"] == \
        "shard __0_0.distcp named in .metadata is missing or not a regular file"


def test_dcp_unreadable_metadata_falls_back_to_presence(written: Path, tmp_path: Path) -> None:
    root = copy(written, "dcp", tmp_path)
    cut(root / "step_20" / ".metadata", 0.5)
    assert name_of(find(root)) == "step_20"  # shards are there: presence is all it can say
    (root / "step_20" / "__0_0.distcp").unlink()
    assert reasons(find(root))["step_20"] == \
        ".metadata cannot be read and no non-empty *.distcp shard is there"


# -- Accelerate save_state ----------------------------------------------------------------
def test_accelerate_project_folder_is_recognised(written: Path, tmp_path: Path) -> None:
    root = copy(written, "accelerate", tmp_path)
    found = find(root)
    assert found.latest is not None and found.latest.layout == "accelerate"
    assert found.latest.path == str(root / "checkpoints" / "checkpoint_1")
    assert name_of(find(root / "checkpoints")) == "checkpoint_1"


@pytest.mark.parametrize(("damage", "reason"), [
    ("cut:model.safetensors", "model.safetensors: truncated"),
    ("cut:optimizer.bin", "optimizer.bin: truncated"),
    ("cut:random_states_0.pkl", "random_states_0.pkl: truncated"),
    ("rm:random_states_0.pkl", "missing random_states_0.pkl"),
    ("rm:model.safetensors", "no model weights"),
])
def test_accelerate_damaged_state_falls_back(written: Path, tmp_path: Path, damage: str,
                                             reason: str) -> None:
    root = copy(written, "accelerate", tmp_path)
    how, name = damage.split(":")
    target = root / "checkpoints" / "checkpoint_1" / name
    if how == "cut":
        cut(target, 0.8)
    else:
        target.unlink()
    found = find(root)
    assert name_of(found) == "checkpoint_0"
    assert reasons(found)["checkpoint_1"].startswith(reason)


def test_accelerate_missing_process_random_state(written: Path, tmp_path: Path) -> None:
    root = copy(written, "accelerate", tmp_path)
    folder = root / "checkpoints" / "checkpoint_1"
    shutil.copy2(folder / "random_states_0.pkl", folder / "random_states_2.pkl")
    assert reasons(find(root))["checkpoint_1"] == \
        "missing random_states_1.pkl of process 1"


# -- Lightning and torch.save -------------------------------------------------------------
def test_lightning_truncated_last_falls_back_to_newest_step(written: Path,
                                                            tmp_path: Path) -> None:
    root = copy(written, "lightning", tmp_path)
    os.utime(root / "last.ckpt", (OLD + 1, OLD + 1))
    assert name_of(find(root)) == "last.ckpt"
    cut(root / "last.ckpt", 0.6)
    os.utime(root / "last.ckpt", (OLD + 1, OLD + 1))
    found = find(root)
    assert name_of(found) == "epoch=1-step=6.ckpt"
    assert reasons(found)["last.ckpt"].startswith("truncated")


def test_torch_save_truncated_falls_back(written: Path, tmp_path: Path) -> None:
    root = copy(written, "torch", tmp_path)
    cut(root / "model_step200.pt", 0.99)
    found = find(root)
    assert name_of(found) == "model_step100.pt"
    assert reasons(found)["model_step200.pt"].startswith("truncated")


# -- DeepSpeed and Megatron (layouts built as they write them) ----------------------------
def ds_tag(root: Path, step: int, mp: int = 2, dp: int = 2) -> Path:
    tag = root / f"global_step{step}"
    tag.mkdir(parents=True)
    for m in range(mp):
        (tag / f"mp_rank_{m:02d}_model_states.pt").write_bytes(zip_bytes())
        for d in range(dp):
            (tag / f"bf16_zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt").write_bytes(
                zip_bytes())
    (root / "latest").write_text(f"global_step{step}")
    for path in (*tag.iterdir(), tag, root / "latest"):
        os.utime(path, (OLD, OLD))
    return tag


def test_deepspeed_complete_tag(tmp_path: Path) -> None:
    ds_tag(tmp_path, 10)
    assert name_of(find(tmp_path)) == "global_step10"


@pytest.mark.parametrize(("victim", "reason"), [
    ("mp_rank_01_model_states.pt", "missing the model states of model-parallel rank 1"),
    ("bf16_zero_pp_rank_0_mp_rank_01_optim_states.pt",
     "missing the optimizer shard of data-parallel rank 0 for model-parallel rank 1"),
])
def test_deepspeed_missing_rank_file(tmp_path: Path, victim: str, reason: str) -> None:
    tag = ds_tag(tmp_path, 10, mp=3)
    (tag / victim).unlink()
    assert reasons(find(tmp_path)) == {"global_step10": reason}


def test_deepspeed_cut_optimizer_shard(tmp_path: Path) -> None:
    tag = ds_tag(tmp_path, 10)
    cut(tag / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", 0.5)
    assert reasons(find(tmp_path))["global_step10"].startswith(
        "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt: truncated")


def megatron_iter(root: Path, iteration: int, tp: int = 2, pp: int = 2) -> Path:
    folder = root / f"iter_{iteration:07d}"
    for t in range(tp):
        for p in range(pp):
            rank = folder / (f"mp_rank_{t:02d}_{p:03d}" if pp > 1 else f"mp_rank_{t:02d}")
            rank.mkdir(parents=True)
            (rank / "model_optim_rng.pt").write_bytes(zip_bytes())
    (root / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    for dirpath, dirs, files in os.walk(root):
        for entry in (*dirs, *files):
            os.utime(os.path.join(dirpath, entry), (OLD, OLD))
    return folder


def test_megatron_complete_iteration(tmp_path: Path) -> None:
    megatron_iter(tmp_path, 300)
    assert name_of(find(tmp_path)) == "iter_0000300"


def test_megatron_missing_pipeline_rank(tmp_path: Path) -> None:
    folder = megatron_iter(tmp_path, 300)
    shutil.rmtree(folder / "mp_rank_01_001")
    assert reasons(find(tmp_path)) == {
        "iter_0000300": "missing mp_rank_01_001: pipeline rank 1"}


def test_megatron_missing_tensor_rank_and_cut_file(tmp_path: Path) -> None:
    folder = megatron_iter(tmp_path, 300, tp=3, pp=1)
    shutil.rmtree(folder / "mp_rank_01")
    assert reasons(find(tmp_path)) == {
        "iter_0000300": "missing mp_rank_01: tensor-parallel rank 1"}
    megatron_iter(tmp_path / "b", 400, tp=1, pp=1)
    cut(tmp_path / "b" / "iter_0000400" / "mp_rank_00" / "model_optim_rng.pt", 0.5)
    assert reasons(find(tmp_path / "b"))["iter_0000400"].startswith(
        "model_optim_rng.pt: truncated")


def test_recent_accelerate_state_is_still_being_written(written: Path, tmp_path: Path) -> None:
    root = copy(written, "accelerate", tmp_path)
    os.utime(root / "checkpoints" / "checkpoint_1" / "random_states_0.pkl", (NOW - 2, NOW - 2))
    found = find(root)
    assert name_of(found) == "checkpoint_0"
    assert "still being written" in reasons(found)["checkpoint_1"]
    assert json.dumps(found.as_dict())  # still the stable JSON shape
