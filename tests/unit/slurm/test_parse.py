from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wrapper.slurm.parse import (
    expand_hostlist,
    parse_exit_pair,
    parse_index_list,
    parse_record,
    split_wait_status,
)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("n1", ["n1"]),
        ("n[1-2]", ["n1", "n2"]),
        ("n[1-3,7],gpu-a[01-02]", ["n1", "n2", "n3", "n7", "gpu-a01", "gpu-a02"]),
        ("node[008-010]", ["node008", "node009", "node010"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("a,b,c", ["a", "b", "c"]),
        ("", []),
    ],
)
def test_expand_hostlist(text: str, names: list[str]) -> None:
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["n[1-2", "n1-2]", "n[a-b]", "n[3-1]"])
def test_expand_hostlist_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        expand_hostlist(text)


@given(prefix=st.from_regex(r"[a-z]{1,5}", fullmatch=True),
       lo=st.integers(0, 500), span=st.integers(0, 50), width=st.integers(1, 4))
def test_expand_range_property(prefix: str, lo: int, span: int, width: int) -> None:
    hi = lo + span
    text = f"{prefix}[{lo:0{width}d}-{hi:0{width}d}]"
    names = expand_hostlist(text)
    assert len(names) == span + 1
    assert len(set(names)) == len(names)
    assert all(n.startswith(prefix) for n in names)
    pad = width if width > 1 and len(str(lo)) < width else 0
    assert names[0] == f"{prefix}{lo:0{pad}d}"


@pytest.mark.parametrize(("status", "pair"), [(0, (0, 0)), (768, (3, 0)), (9, (0, 9)),
                                              (15, (0, 15)), (256, (1, 0))])
def test_split_wait_status(status: int, pair: tuple[int, int]) -> None:
    assert split_wait_status(status) == pair


@pytest.mark.parametrize(("text", "pair"), [("3:0", (3, 0)), ("0:9", (0, 9)), ("1", (1, 0))])
def test_parse_exit_pair(text: str, pair: tuple[int, int]) -> None:
    assert parse_exit_pair(text) == pair


@pytest.mark.parametrize(("text", "ids"), [("0,1", [0, 1]), ("0-3,6", [0, 1, 2, 3, 6]),
                                           ("2", [2]), ("", [])])
def test_parse_index_list(text: str, ids: list[int]) -> None:
    assert parse_index_list(text) == ids


def test_parse_record_keeps_values_with_spaces() -> None:
    line = ("NodeName=n2 Arch=x86_64 State=IDLE+DRAIN Reason=jobwrap: ecc on gpu 1 "
            "[root@2026-12-02T10:00:00] Comment=(null)")
    record = parse_record(line)
    assert record["NodeName"] == "n2"
    assert record["State"] == "IDLE+DRAIN"
    assert record["Reason"] == "jobwrap: ecc on gpu 1 [root@2026-12-02T10:00:00]"
    assert record["Comment"] == "(null)"


def test_parse_record_job_line() -> None:
    line = ("JobId=12 JobName=train run UserId=alice(1001) JobState=FAILED Reason=NonZeroExitCode "
            "ExitCode=3:0 RestartCnt=1 ExcNodeList=n1 TRES=cpu=2,node=1,billing=2")
    record = parse_record(line)
    assert record["JobName"] == "train run"
    assert record["ExitCode"] == "3:0"
    assert record["TRES"] == "cpu=2,node=1,billing=2"
    assert record["ExcNodeList"] == "n1"


@pytest.mark.parametrize(("text", "nodes"), [
    ("srun: error: Task launch for StepId=7.1 failed on node n2: Communication connection "
     "failure\nsrun: error: Application launch failed: Communication connection failure\n",
     ["n2"]),
    ("srun: error: Node failure on n[2-3]\nsrun: error: Node failure on n3\n", ["n2", "n3"]),
    ("srun: error: n2: task 1: Killed\nsrun: Terminating StepId=7.0\n", []),  # a task's death
    # a launch refused for another reason than the node: no node to wait for
    ("srun: error: Task launch for StepId=7.1 failed on node n2: Invalid job credential\n", []),
    ("srun: error: Node failure on n[9-]\n", []),  # not a host list: skipped, never raises
    ("srun: error: Node failure on x[1-100000]\n", []),  # too many to be this job's: skipped
    ("srun: error: Node failure on n7\n", []),  # not a node of the job
    ("", []),
])
def test_nodes_srun_could_not_reach(text: str, nodes: list[str]) -> None:
    from wrapper.slurm.parse import nodes_srun_lost

    assert nodes_srun_lost(text, among=["n1", "n2", "n3"]) == nodes


def test_node_lists_longer_than_the_job_are_never_expanded() -> None:
    from wrapper.slurm import parse

    text = "".join(f"srun: error: Node failure on h{i}x[0-4095]\n" for i in range(2500))
    expanded: list[int] = []
    real = parse.expand_hostlist

    def counting(text: str, *, max_hosts: int = parse.MAX_HOSTS) -> list[str]:
        names = real(text, max_hosts=max_hosts)
        expanded.append(len(names))
        return names

    parse.expand_hostlist = counting  # type: ignore[assignment]
    try:
        found = parse.nodes_srun_lost(text[-65536:] + "Node failure on n2\n",
                                      among=["n1", "n2"])
    finally:
        parse.expand_hostlist = real  # type: ignore[assignment]
    assert found == ["n2"] and expanded == [1]  # 4,096-name lists refused before expanding
