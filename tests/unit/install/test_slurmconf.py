"""slurm.conf merged as an admin would by hand: only what is missing is added, lists get an
item, nothing of the site's is replaced; a file jobwrap cannot merge stops with every
reason; and the merge comes back out exactly, even after the site edited the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wrapper.install.slurmconf import (
    BLOCK_HEADER,
    Edit,
    SlurmConfError,
    host_nodes,
    merge,
    unmerge,
    wants,
)

PREFIX = "/opt/jobwrap"
SITE = """# the site's own
ClusterName=big
SlurmctldHost=ctl1(10.0.0.1)
SchedulerParameters=bf_continue,bf_window=2880   # tuned
PrologFlags=X11
NodeName=gpu[01-04] NodeHostname=h[1-4] CPUs=64 Gres=gpu:8
PartitionName=gpu Nodes=gpu[01-04] Default=YES
"""


def _conf(tmp_path: Path, text: str, name: str = "slurm.conf") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_missing_lines_are_added_and_lists_extended(tmp_path: Path) -> None:
    path = _conf(tmp_path, SITE)
    merged = merge(path, wants(PREFIX))
    lines = merged.text.splitlines()
    assert "SchedulerParameters=bf_continue,bf_window=2880,nohold_on_prolog_fail   # tuned" \
        in lines
    assert "PrologFlags=X11,Alloc" in lines
    block = merged.text.split(BLOCK_HEADER + "\n", 1)[1].splitlines()
    assert block == [f"Prolog={PREFIX}/prolog/prolog", f"Epilog={PREFIX}/epilog/epilog",
                     f"TaskProlog={PREFIX}/prolog/task-prolog", "JobRequeue=1",
                     "JobSubmitPlugins=lua", f"HealthCheckProgram={PREFIX}/prolog/healthcheck",
                     "HealthCheckInterval=300"]
    assert merged.text.count("\n") == SITE.count("\n") + 2 + len(block)
    assert {(e.key, e.action) for e in merged.edits} >= {("SchedulerParameters", "extended"),
                                                         ("PrologFlags", "extended"),
                                                         ("Prolog", "added")}


def test_a_second_merge_changes_nothing(tmp_path: Path) -> None:
    path = _conf(tmp_path, SITE)
    once = merge(path, wants(PREFIX)).text
    twice = merge(path, wants(PREFIX), text=once)
    assert twice.text == once and twice.edits == [] and twice.hooks == []


def test_what_already_gives_it_is_not_added_again(tmp_path: Path) -> None:
    path = _conf(tmp_path, 'PrologFlags=Contain\nJobSubmitPlugins="job_submit/lua"\n'
                 'JobRequeue=0\nHealthCheckProgram=/usr/sbin/nhc\n')
    merged = merge(path, wants(PREFIX))
    assert "PrologFlags=Contain\n" in merged.text  # Contain implies Alloc
    assert 'JobSubmitPlugins="job_submit/lua"\n' in merged.text
    assert "JobRequeue=0\n" in merged.text and "HealthCheckProgram=/usr/sbin/nhc\n" in \
        merged.text
    assert any(n.startswith("JobRequeue=0 kept") for n in merged.notes)
    assert any(n.startswith("HealthCheckProgram=/usr/sbin/nhc kept") for n in merged.notes)


def test_a_quoted_list_stays_quoted(tmp_path: Path) -> None:
    path = _conf(tmp_path, 'SchedulerParameters="bf_continue"\n')
    merged = merge(path, wants(PREFIX))
    assert 'SchedulerParameters="bf_continue,nohold_on_prolog_fail"\n' in merged.text


def test_a_folder_of_prologs_gets_jobwraps_as_one_more(tmp_path: Path) -> None:
    path = _conf(tmp_path, "Prolog=/etc/slurm/prolog.d/*\nEpilog=/etc/slurm/epilog.d/*.sh\n")
    merged = merge(path, wants(PREFIX))
    assert merged.hooks == [("/etc/slurm/prolog.d/jobwrap-prolog", "prolog"),
                            ("/etc/slurm/epilog.d/jobwrap-epilog.sh", "epilog")]
    assert merged.text.startswith("Prolog=/etc/slurm/prolog.d/*\nEpilog=/etc/slurm/epilog.d/"
                                  "*.sh\n")


def test_what_cannot_be_merged_is_all_said_at_once(tmp_path: Path) -> None:
    _conf(tmp_path, "SchedulerParameters=bf_continue\n", "sched.conf")
    path = _conf(tmp_path, "Prolog=/usr/local/sbin/site-prolog\nTaskProlog=/x/tp\n"
                 "Include sched.conf\nJobRequeue=1\nJobRequeue=1\nEpilog=/a \\\n")
    with pytest.raises(SlurmConfError) as err:
        merge(path, wants(PREFIX))
    problems = "\n".join(err.value.problems)
    assert f"Prolog=/usr/local/sbin/site-prolog ({path}:1)" in problems
    assert "set Prolog=/etc/slurm/prolog.d/*" in problems
    assert f"TaskProlog=/x/tp ({path}:2)" in problems
    assert f"SchedulerParameters=bf_continue ({tmp_path}/sched.conf:1) lacks " \
           "nohold_on_prolog_fail" in problems
    assert f"JobRequeue is set 2 times ({path}:4, {path}:5)" in problems
    assert str(err.value).startswith(f"{path}: not changed:")


@pytest.mark.parametrize(("text", "said"), [
    ("Include missing.conf\n", "Include missing.conf: no such file"),
    ("Include /etc/slurm/%c.conf\n", "%-expansion is Slurm's"),
    ("ClusterName=a\nthis is not slurm\n", ":2: 'this' is not Key=Value"),
    ('ClusterName="unclosed\n', ":1: No closing quotation"),
    ("SchedulerParameters=a,\\\nb\n", "add it there by hand"),
])
def test_a_file_slurm_would_refuse_or_jobwrap_cannot_follow_stops(tmp_path: Path, text: str,
                                                                  said: str) -> None:
    path = _conf(tmp_path, text)
    with pytest.raises(SlurmConfError, match="not changed") as err:
        merge(path, wants(PREFIX))
    assert said in str(err.value)


def test_bytes_that_are_not_text_are_named(tmp_path: Path) -> None:
    path = tmp_path / "slurm.conf"
    path.write_bytes(b"ClusterName=a\n\xff\xfe\n")
    with pytest.raises(SlurmConfError, match="byte 14 is not UTF-8"):
        merge(path, wants(PREFIX))


def test_unmerge_after_the_site_edited_takes_out_only_jobwraps(tmp_path: Path) -> None:
    path = _conf(tmp_path, SITE)
    merged = merge(path, wants(PREFIX))
    edited = merged.text.replace("ClusterName=big", "ClusterName=bigger") + "MaxJobCount=9\n"
    edited = edited.replace("PrologFlags=X11,Alloc", "PrologFlags=X11,Alloc,Serial")
    text, notes = unmerge(path, edited, merged.edits)
    want = SITE.replace("ClusterName=big", "ClusterName=bigger").replace(
        "PrologFlags=X11", "PrologFlags=X11,Serial")
    assert notes == []
    assert text == want + "MaxJobCount=9\n"


def test_unmerge_names_what_the_site_took_out_itself(tmp_path: Path) -> None:
    path = _conf(tmp_path, "ClusterName=a\n")
    merged = merge(path, wants(PREFIX))
    edited = merged.text.replace(f"Prolog={PREFIX}/prolog/prolog\n", "")
    text, notes = unmerge(path, edited, merged.edits)
    assert text == "ClusterName=a\n"
    assert notes == [f"Prolog={PREFIX}/prolog/prolog: no longer in {path} (changed since "
                     "install); left"]


_SITE_LINES = st.sampled_from([
    "ClusterName=c", "SchedulerParameters=bf_continue", "PrologFlags=X11",
    "PrologFlags=Contain", "JobRequeue=0", "JobSubmitPlugins=lua",
    "HealthCheckInterval=60", "# a comment", "", "NodeName=n[1-2] CPUs=4",
    "SchedulerParameters=bf_window=60,defer   # why", "MaxArraySize=1001",
    "PartitionName=p Nodes=ALL", "SlurmdTimeout=300 MessageTimeout=30"])


@settings(max_examples=150, deadline=None)
@given(st.lists(_SITE_LINES, max_size=12))
def test_merge_then_unmerge_gives_the_file_back(tmp_path_factory: pytest.TempPathFactory,
                                                lines: list[str]) -> None:
    keys = [word.split("=", 1)[0] for line in lines
            if not line.startswith(("NodeName", "PartitionName"))
            for word in line.split("#")[0].split()]
    if len(keys) != len(set(keys)):
        return  # a key set twice is refused (test above)
    text = "".join(f"{line}\n" for line in lines)
    path = _conf(tmp_path_factory.mktemp("c"), text)
    merged = merge(path, wants(PREFIX))
    back, notes = unmerge(path, merged.text, merged.edits)
    assert (back, notes) == (text, [])
    assert merge(path, wants(PREFIX), text=merged.text).edits == []


def test_the_nodes_of_a_host_and_the_controller_are_read(tmp_path: Path) -> None:
    path = _conf(tmp_path, SITE + "NodeName=cpu[1-2] CPUs=8\nNodeName=DEFAULT CPUs=2\n")
    assert host_nodes(path, "h3") == (False, ["gpu03"])
    assert host_nodes(path, "cpu2") == (False, ["cpu2"])
    assert host_nodes(path, "ctl1") == (True, [])
    assert host_nodes(path, "elsewhere") == (False, [])


def test_an_edit_round_trips_through_the_record() -> None:
    edit = Edit("PrologFlags", "extended", "Alloc")
    assert Edit(**edit.as_dict()) == edit


def test_slurms_own_separators_are_read_and_an_operator_line_is_refused(tmp_path: Path
                                                                        ) -> None:
    path = _conf(tmp_path, "PrologFlags = Contain\nSchedulerParameters = bf_continue  # x\n")
    merged = merge(path, wants(PREFIX))
    assert "PrologFlags = Contain\n" in merged.text  # Contain gives Alloc: untouched
    assert "SchedulerParameters = bf_continue,nohold_on_prolog_fail  # x\n" in merged.text
    assert unmerge(path, merged.text, merged.edits) == (path.read_text(), [])
    path = _conf(tmp_path, "SchedulerParameters=a\nSchedulerParameters+=b\n")
    with pytest.raises(SlurmConfError, match=r"SchedulerParameters\+=b .*does not merge"):
        merge(path, wants(PREFIX))


def test_a_file_without_a_last_newline_comes_back_as_it_was(tmp_path: Path) -> None:
    path = _conf(tmp_path, "ClusterName=a\nSchedulerParameters=x")
    merged = merge(path, wants(PREFIX))
    assert merged.text.startswith("ClusterName=a\nSchedulerParameters=x,nohold_on_prolog_fail"
                                  "\n\n# jobwrap")
    assert unmerge(path, merged.text, merged.edits) == (path.read_text(), [])
