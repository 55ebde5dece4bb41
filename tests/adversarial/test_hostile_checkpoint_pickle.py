"""A hostile torch.distributed.checkpoint ``.metadata``: a pickle that runs code when loaded.

The user owns the checkpoint folder, and root's epilog judges it (through the user-rights
seam, as ``_latest_checkpoint`` does). Each pickle below would run a command under a plain
``pickle.load``; discovery must never run it, and still answer: the step falls back to a
presence check of its shards, or is rejected, and an older step remains the fallback.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support import framework_python
from wrapper.checkpoints import latest_valid
from wrapper.osl.child import call_as
from wrapper.osl.users import UserIds

KINDS = ("os.system", "eval", "subprocess", "nested", "getattr")


class _Reduce:
    """Pickles as ``callable(*args)``: what an attacker writes into ``.metadata``."""

    def __init__(self, module: str, name: str, args: tuple[Any, ...]) -> None:
        self.module, self.name, self.args = module, name, args

    def __reduce__(self) -> tuple[Any, ...]:
        import importlib

        return getattr(importlib.import_module(self.module), self.name), self.args


def _text(value: str) -> bytes:
    """A pickle BINUNICODE opcode pushing ``value``."""
    raw = value.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _hostile(kind: str, marker: Path) -> bytes:
    command = f"touch {marker}"
    if kind == "os.system":
        return pickle.dumps(_Reduce("os", "system", (command,)))
    if kind == "eval":
        return pickle.dumps(_Reduce("builtins", "eval",
                                    (f"__import__('os').system({command!r})",)))
    if kind == "subprocess":
        return pickle.dumps(_Reduce("subprocess", "call", (["touch", str(marker)],)))
    if kind == "nested":  # os.system inside what looks like DCP's Metadata
        return (b"\x80\x04ctorch.distributed.checkpoint.metadata\nMetadata\n)\x81}"
                + _text("storage_data") + b"cos\nsystem\n" + _text(command) + b"\x85Rsb.")
    if kind == "getattr":  # getattr(__import__("os"), "system")(command)
        return (b"\x80\x04cbuiltins\ngetattr\ncbuiltins\n__import__\n" + _text("os")
                + b"\x85R" + _text("system") + b"\x86R" + _text(command) + b"\x85R.")
    raise AssertionError(kind)


def test_each_hostile_pickle_does_run_under_a_plain_load(tmp_path: Path) -> None:
    """The attacks are real: the framework venv's pickle.load (torch importable) runs each."""
    for kind in KINDS:
        marker = tmp_path / f"ran-{kind.replace('.', '-')}"
        source = tmp_path / f"{marker.name}.pkl"
        source.write_bytes(_hostile(kind, marker))
        subprocess.run([framework_python(), "-c", "import pickle, sys; "
                        "pickle.load(open(sys.argv[1], 'rb'))", str(source)],
                       capture_output=True, timeout=120, check=False)
        assert marker.exists(), f"{kind}: the attack does not even work on pickle.load"


def _discover(directory: str) -> dict[str, Any]:
    found = latest_valid(directory, settle_seconds=0)
    return {"latest": found.latest.path if found.latest else None,
            "skipped": [[s.path, s.reason] for s in found.skipped]}


@pytest.mark.parametrize("kind", KINDS)
def test_hostile_dcp_metadata_never_runs(kind: str, user: UserIds, shared: Path) -> None:
    marker = shared / "pwned"
    ckpt = shared / "ckpt"
    for step in (10, 20):
        (ckpt / f"step_{step}").mkdir(parents=True)
        (ckpt / f"step_{step}" / "__0_0.distcp").write_bytes(b"x" * 64)
    (ckpt / "step_10" / ".metadata").write_bytes(pickle.dumps({"not": "dcp"}))
    (ckpt / "step_20" / ".metadata").write_bytes(_hostile(kind, marker))
    # The user's own files, as the attacker leaves them.
    for dirpath, dirs, files in os.walk(shared):
        for name in (*dirs, *files):
            os.chown(os.path.join(dirpath, name), user.uid, user.gid)
    os.chmod(shared, 0o777)  # noqa: S103 - the marker could be made, were anything run
    found = call_as(user, _discover, str(ckpt))
    assert not marker.exists(), f"the {kind} pickle ran"
    # Unreadable as DCP metadata: judged by the presence of its shard, never loaded.
    assert found["latest"] == str(ckpt / "step_20")
    (ckpt / "step_20" / "__0_0.distcp").unlink()
    found = call_as(user, _discover, str(ckpt))
    assert not marker.exists()
    assert found["latest"] == str(ckpt / "step_10")
    assert found["skipped"] == [[str(ckpt / "step_20"), ".metadata cannot be read and no "
                                 "non-empty *.distcp shard is there"]]
