"""The Xid table and the kernel-log reader that finds recent Xids."""

from __future__ import annotations

from pathlib import Path

import pytest

from wrapper.gpu import kmsg
from wrapper.gpu.xid import XIDS, classify, parse_codes


@pytest.mark.parametrize(("code", "action"), [
    (48, "drain"), (63, "drain"), (64, "drain"), (74, "drain"), (79, "drain"), (92, "drain"),
    (94, "drain"), (95, "drain"), (119, "drain"), (120, "drain"),
    (13, "app"), (31, "app"), (43, "app"), (45, "app"),
    (38, "warn"), (69, "warn"),
    (4242, "warn"),  # unknown Xids are logged, never drain on their own
])
def test_the_table_says_what_each_xid_means(code: int, action: str) -> None:
    info = classify(code)
    assert (info.code, info.action) == (code, action)
    assert info.name


def test_site_overrides_win() -> None:
    assert classify(38, drain_extra={38}).action == "drain"
    assert classify(79, ignore={79}).action == "ignore"
    assert classify(79, drain_extra={79}, ignore={79}).action == "ignore"


def test_every_entry_is_consistent() -> None:
    for code, info in XIDS.items():
        assert info.code == code
        assert info.action in ("drain", "warn", "app")


def test_config_xid_lists_are_checked() -> None:
    codes, problems = parse_codes(["79", " 48 "], "xid_drain")
    assert codes == {79, 48} and problems == []
    codes, problems = parse_codes(["x79"], "xid_ignore")
    assert codes == set()
    assert problems == ["[checks] xid_ignore: 'x79' is not an Xid number (write e.g. \"79\")"]


@pytest.mark.parametrize(("message", "expected"), [
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", ("0000:3b:00", 79)),
    ("NVRM: Xid (PCI:0000:10:1C): 63, pid=1896, Row Remapper: New row", ("0000:10:1c", 63)),
    ("NVRM: Xid (0000:01:00): 13, Graphics Exception", ("0000:01:00", 13)),
    ("NVRM: Xid (PCI:00000000:3b:00.0): 48, DBE", ("0000:3b:00", 48)),
    ("NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014", None),
    ("usb 1-1: new device", None),
])
def test_xid_lines_are_parsed(message: str, expected: tuple[str, int] | None) -> None:
    assert kmsg.parse_xid(message) == expected


def test_kmsg_records_are_parsed() -> None:
    assert kmsg.parse_record("4,1234,5000000,-;NVRM: hello") == (5.0, "NVRM: hello")
    assert kmsg.parse_record("6,5,77,-,caller=T1;x;y") == (77e-6, "x;y")
    assert kmsg.parse_record(" SUBSYSTEM=pci") is None
    assert kmsg.parse_record("garbage") is None


def test_device_key_matches_the_kernel_logs_form() -> None:
    assert kmsg.device_key("0000:3b:00.0") == "0000:3b:00"


def test_recent_xids_keeps_the_window_and_each_code_once(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("\n".join([
        "4,1,1000000,-;NVRM: Xid (PCI:0000:3b:00): 48, old DBE",       # t=1 s: too old
        "4,2,5000000,-;NVRM: Xid (PCI:0000:3b:00): 13, app fault",
        " DEVICE=+pci:0000:3b:00.0",
        "4,3,6000000,-;NVRM: Xid (PCI:0000:3b:00): 13, again",
        "4,4,7000000,-;NVRM: Xid (PCI:0000:5d:00): 79, GPU has fallen off the bus.",
        "6,5,8000000,-;nvidia-modeset: something else",
    ]))
    found = kmsg.recent_xids(str(log), window=6.0, now=10.0)
    assert found == {"0000:3b:00": [13], "0000:5d:00": [79]}
    assert kmsg.recent_xids(str(log), window=100.0, now=10.0)["0000:3b:00"] == [48, 13]


def test_an_unreadable_kernel_log_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        kmsg.recent_xids(str(tmp_path / "none"), window=10)


@pytest.mark.parametrize("line", [
    # a segfault record: the file name the fault was in is the user's
    "6,900,5000000,-;python3[3143]: segfault at 7f21 ip 00007f21 sp 00007ffd error 15 in "
    "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus[7f21+1000]",
    # comm (15 bytes) names the process as the driver's lines begin, the file the rest
    "6,901,5000000,-;NVRM: Xid (PCI:[3150]: segfault at 7f21 ip 00007f21 sp 00007ffd "
    "error 15 in 0000:3b:00): 79, x[7f21+1000]",
    # written to /dev/kmsg from user space: facility user (1 << 3 | level)
    "12,902,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
    "14,903,5000000,-;NVRM: Xid (PCI:0000:3b:00): 48, DBE",
])
def test_only_the_kernels_own_xid_records_count(tmp_path: Path, line: str) -> None:
    log = tmp_path / "kmsg"
    log.write_text(line + "\n4,904,5000000,-;NVRM: Xid (PCI:0000:5d:00): 13, app fault\n")
    assert kmsg.recent_xids(str(log), window=100.0, now=10.0) == {"0000:5d:00": [13]}
