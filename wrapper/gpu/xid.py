"""What each NVIDIA Xid means for the node: drain it, warn, or blame the application.

Sources: NVIDIA's Xid catalogue, "Xid Errors" (docs.nvidia.com/deploy/xid-errors/, the
catalogue for Ampere and newer in analyzing-xid-catalog.html, whose "Resolution Bucket"
column says RESTART_APP, RESET_GPU, RESTART_BM, CONTACT_SUPPORT ...), and the
Dynamic Page Retirement and A100/H100 memory error management guides for 48, 63, 64,
92, 94 and 95. An Xid whose immediate action is a GPU reset, a reboot or an RMA drains:
the next job on that GPU would fail too. An Xid the catalogue resolves by restarting the
application, and that NVIDIA attributes to the program (illegal memory access, a kernel
stopped by the user), is the application's fault and never drains. Everything else, and
every Xid not in this table, warns: it is logged so that a pattern can be seen, but one
event alone does not take a node out of service.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from wrapper.fastdataclass import dataclass

XidAction = Literal["drain", "warn", "app", "ignore"]


@dataclass(frozen=True)
class XidInfo:
    code: int
    name: str
    action: XidAction


def _table(action: XidAction, entries: dict[int, str]) -> dict[int, XidInfo]:
    return {code: XidInfo(code, name, action) for code, name in entries.items()}


XIDS: dict[int, XidInfo] = {
    # The application's fault (catalogue: "user application error", RESTART_APP).
    **_table("app", {
        13: "graphics engine exception",
        31: "GPU memory page fault (illegal address)",
        43: "GPU stopped processing (the application's channel was reset)",
        45: "preemptive cleanup after an earlier error",
    }),
    # Worth a log line, not a drain on their own (driver or firmware events that the
    # catalogue resolves by restarting the application or that need a pattern to act on).
    **_table("warn", {
        8: "GPU stopped processing (channel idle timeout)",
        32: "invalid or corrupted push buffer stream",
        38: "driver firmware error",
        44: "graphics engine fault during context switch",
        46: "GPU stopped processing",
        56: "display engine error",
        61: "internal micro-controller breakpoint/warning",
        68: "video processor (NVDEC) exception",
        69: "graphics engine class error",
        109: "context switch timeout",
    }),
    # The GPU needs a reset, a reboot or service (catalogue: RESET_GPU, RESTART_BM,
    # CONTACT_SUPPORT), or its memory is failing.
    **_table("drain", {
        48: "double-bit ECC error (DBE)",
        62: "internal micro-controller halt",
        63: "ECC page retirement or row remapping recorded (reset to activate)",
        64: "ECC page retirement or row remapping failed",
        74: "NVLink error",
        79: "GPU has fallen off the bus",
        92: "high single-bit ECC error rate",
        94: "contained ECC error (row remap pending: reset the GPU)",
        95: "uncontained ECC error",
        119: "GSP RPC timeout",
        120: "GSP error",
        140: "unrecovered ECC error",
        154: "GPU recovery action changed (reset or reboot required)",
    }),
}


def classify(code: int, *, drain_extra: Collection[int] = (),
             ignore: Collection[int] = ()) -> XidInfo:
    """The action for one Xid; the site's ``[checks] xid_drain``/``xid_ignore`` win."""
    known = XIDS.get(code)
    name = known.name if known else "not in jobwrap's Xid table (see NVIDIA's Xid catalogue)"
    if code in ignore:
        return XidInfo(code, name, "ignore")
    if code in drain_extra:
        return XidInfo(code, name, "drain")
    return known or XidInfo(code, name, "warn")


def parse_codes(values: Collection[str], key: str) -> tuple[frozenset[int], list[str]]:
    """Xid numbers from a config array of strings, and a problem line for each bad one."""
    codes: set[int] = set()
    problems = []
    for value in values:
        text = value.strip()
        if text.isdigit():
            codes.add(int(text))
        else:
            problems.append(f"[checks] {key}: {value!r} is not an Xid number (write e.g. "
                            '"79")')
    return frozenset(codes), problems
