"""torch.distributed.checkpoint folders: ``.metadata`` and every shard it names, long enough.

``.metadata`` is a pickle of DCP's ``Metadata``; its ``storage_data`` maps every stored
item to ``_StorageInfo(relative_path, offset, length)``, so a folder is complete when
each file named there exists and reaches ``offset + length`` of every item in it.

The pickle is the user's file and root's epilog judges it (with the user's rights, but
still): it is read with ``SafeUnpickler``, which never imports or calls anything.
Classes of DCP's own modules, torch's ``Size``/dtype/layout helpers and pathlib paths
become inert ``_Stub`` records of their arguments and state; builtins are admitted only
as plain data types (``getattr``, which DCP uses for an enum member, answers a stub);
any other global (``os.system``, ``subprocess.Popen``, ``builtins.eval`` ...) stops the
read. When the metadata cannot be read that way, the check falls back to presence:
``.metadata`` and at least one non-empty ``*.distcp`` shard.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

from wrapper.checkpoints.content import file_size, plain_name, read_small
from wrapper.checkpoints.hfweights import entry_names
from wrapper.checkpoints.layout import Rejected

DCP_MARKER = ".metadata"
METADATA_LIMIT = 64 << 20
_STUB_MODULES = ("torch.distributed.checkpoint.", "torch.distributed.tensor.")
_STUB_EXACT = {"torch", "torch.serialization", "pathlib", "collections"}
_PRIVATE_ADMITTED = {"_StorageInfo", "_get_layout", "_MEM_FORMAT_ENCODING"}
_BUILTIN_TYPES = {"dict", "list", "tuple", "set", "frozenset", "int", "float", "str",
                  "bytes", "bytearray", "bool", "complex"}


class _Stub:
    """Stands in for an admitted class or function: keeps arguments and state, does nothing."""

    _qualname = ""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.args = args
        self.state: dict[str, Any] = {}

    def __new__(cls, *args: object, **kwargs: object) -> _Stub:
        obj = super().__new__(cls)
        obj.args = args
        obj.state = {}
        return obj

    def __setstate__(self, state: object) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
            for part in state:
                if isinstance(part, dict):
                    self.state.update(part)
        elif isinstance(state, dict):
            self.state.update(state)

    def __call__(self, *args: object, **kwargs: object) -> _Stub:
        return _stub_class(f"{self._qualname}()")(*args)


def _stub_class(qualname: str) -> type[_Stub]:
    return type("_Stub", (_Stub,), {"_qualname": qualname, "__slots__": ()})


def _safe_getattr(obj: object, name: object, *default: object) -> _Stub:
    return _stub_class(f"getattr({name!r})")()


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that admits DCP metadata classes as inert stubs and builtins as data."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins":
            if name in _BUILTIN_TYPES:
                import builtins

                return getattr(builtins, name)
            if name == "getattr":
                return _safe_getattr
        elif (module in _STUB_EXACT or module.startswith(_STUB_MODULES)) and (
                not name.startswith("_") or name in _PRIVATE_ADMITTED):
            return _stub_class(f"{module}.{name}")
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in DCP metadata")

    def persistent_load(self, pid: object) -> Any:
        raise pickle.UnpicklingError("persistent ids are not allowed in DCP metadata")


def storage_extents(raw: bytes) -> dict[str, int]:
    """Every shard file ``.metadata`` names and the length each must reach.

    Raises pickle.UnpicklingError (or ValueError) when the bytes are not DCP metadata
    this reader admits.
    """
    try:
        meta = SafeUnpickler(io.BytesIO(raw)).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, IndexError,
            KeyError, MemoryError, RecursionError, UnicodeDecodeError) as exc:
        raise ValueError(str(exc)[:200]) from None
    storage = meta.state.get("storage_data") if isinstance(meta, _Stub) else None
    if not isinstance(storage, dict):
        raise ValueError("no storage_data in it")
    extents: dict[str, int] = {}
    for info in storage.values():
        fields = info.state if isinstance(info, _Stub) else {}
        path, offset, length = (fields.get("relative_path"), fields.get("offset"),
                                fields.get("length"))
        if not (isinstance(offset, int) and isinstance(length, int)) or offset < 0 \
                or length < 0:
            raise ValueError("a storage entry without offset and length")
        if not isinstance(path, str) or not plain_name(path):
            raise Rejected(f"{DCP_MARKER} names shard {str(path)[:60]!r}, not a file in the "
                           "folder")
        extents[path] = max(extents.get(path, 0), offset + length)
    return extents


def check_dcp_folder(path: str) -> float:
    """Reject a DCP folder whose shards are missing or short; returns the newest mtime."""
    meta_path = os.path.join(path, DCP_MARKER)
    newest = os.lstat(meta_path).st_mtime
    try:
        extents = storage_extents(read_small(meta_path, METADATA_LIMIT))
    except (ValueError, Rejected) as exc:
        if isinstance(exc, Rejected) and "names shard" in exc.reason:
            raise
        return max(newest, _presence(path))
    for shard, needed in sorted(extents.items()):
        try:
            size = file_size(os.path.join(path, shard))
        except Rejected:
            raise Rejected(f"shard {shard} named in {DCP_MARKER} is missing or not a "
                           "regular file") from None
        if size < needed:
            raise Rejected(f"shard {shard} is cut short: {size} bytes, {DCP_MARKER} needs "
                           f"{needed}")
    return newest


def _presence(path: str) -> float:
    shards = [n for n in entry_names(path) if n.endswith(".distcp")]
    if not shards or not any(file_size(os.path.join(path, n)) > 0 for n in shards):
        raise Rejected(f"{DCP_MARKER} cannot be read and no non-empty *.distcp shard is there")
    return 0.0
