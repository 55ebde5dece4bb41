"""The login guard's rules, as tables of samples: no process is started here."""

from __future__ import annotations

import grp

import pytest

from wrapper.config import LoginGuardConfig
from wrapper.errors import ConfigError
from wrapper.loginguard.rules import (
    GIB,
    Policy,
    ProcessSample,
    Snapshot,
    command_words,
    evaluate,
    printable,
)


def policy(**overrides: object) -> Policy:
    cfg = LoginGuardConfig(**overrides)
    return Policy.from_config(cfg, "test.toml", own_pids=[4242])


def sample(pid: int, name: str = "python3", *, uid: int = 2000, cores: float = 0.0,
           rss: int = 0, cmdline: tuple[str, ...] = (), signature: str = "",
           ai_library: str = "", exempt: str = "", children: float = 0.0) -> ProcessSample:
    return ProcessSample(pid=pid, create_time=1000.0 + pid, uid=uid, user=f"u{uid}",
                         name=name, cmdline=cmdline or (name,), cpu_cores=cores, rss=rss,
                         signature=signature, ai_library=ai_library,
                         session=name in {"bash", "sshd"}, exempt=exempt,
                         children_cores=children)


def snapshot(*samples: ProcessSample, cpus: int = 10, measured: bool = True,
             unseen: dict[int, float] | None = None) -> Snapshot:
    return Snapshot(tuple(samples), cpus, measured, 10.0, len(samples), unseen or {})


@pytest.mark.parametrize(
    ("cmdline", "words"),
    [
        (("/usr/bin/torchrun", "--nproc_per_node=8", "train.py"),
         ("torchrun", "--nproc_per_node=8", "train.py")),
        (("/venv/bin/python3", "/venv/bin/accelerate", "launch", "t.py"),
         ("accelerate", "launch", "t.py")),
        (("python", "-u", "-m", "torch.distributed.run", "x.py"),
         ("torch.distributed.run", "x.py")),
        (("python3.11", "-mvllm.entrypoints.openai.api_server"),
         ("vllm.entrypoints.openai.api_server",)),
        (("python3", "-W", "ignore", "serve.py"), ("serve.py",)),
        (("python3", "-c", "import torch"), ()),
        (("python3",), ()),
        ((), ()),
        (("grep", "torchrun", "notes.txt"), ("grep", "torchrun", "notes.txt")),
    ],
)
def test_command_words_start_at_the_program(cmdline: tuple[str, ...],
                                            words: tuple[str, ...]) -> None:
    assert command_words(cmdline) == words


@pytest.mark.parametrize(
    ("name", "cmdline", "expected"),
    [
        ("torchrun", ("torchrun", "300"), "torchrun"),  # a renamed binary
        ("python3", ("torchrun", "-c", "pass"), "torchrun"),  # argv[0] set by the launcher
        ("python3", ("/v/bin/python3", "/v/bin/deepspeed", "t.py"), "deepspeed"),
        ("accelerate", ("/v/bin/python", "/v/bin/accelerate", "launch", "t.py"),
         "accelerate launch"),
        ("accelerate", ("/v/bin/python", "/v/bin/accelerate", "config"), ""),
        ("vllm", ("vllm", "serve", "meta-llama/Llama-3-8B"), "vllm serve"),
        ("python3", ("python3", "-m", "vllm.entrypoints.openai.api_server"),
         "vllm.entrypoints.openai.api_server"),
        ("grep", ("grep", "torchrun", "log.txt"), ""),  # a mention is not a run
        ("vim", ("vim", "torchrun.sh"), ""),
        ("python3", ("python3", "train_torchrun.py"), ""),
    ],
)
def test_ai_signatures(name: str, cmdline: tuple[str, ...], expected: str) -> None:
    assert policy().signature(name, cmdline) == expected


def test_cpu_rule_sums_a_users_processes_and_targets_the_busy_ones() -> None:
    p = policy(cpu_share=0.1)
    found = evaluate(snapshot(sample(1, cores=0.6), sample(2, cores=0.6),
                              sample(3, "vim", cores=0.001, exempt="vim"),
                              sample(4, "bash", cores=0.2)),
                     p, set())
    [finding] = found
    assert (finding.rule, finding.kind, finding.user) == ("cpu", "cpu", "u2000")
    assert finding.value == pytest.approx(0.14)
    # the idle editor is not what loads the node; the shell is never a target
    assert [t.pid for t in finding.targets] == [1, 2]
    assert "1.40 cores (14% of the node's 10)" in finding.seen and "allowed 10%" in finding.seen


def test_cpu_rule_needs_a_measurement_and_respects_the_share() -> None:
    p = policy(cpu_share=0.1)
    assert evaluate(snapshot(sample(1, cores=5.0), measured=False), p, set()) == []
    assert evaluate(snapshot(sample(1, cores=1.0)), p, set()) == []  # exactly 10%: allowed
    assert evaluate(snapshot(sample(1, cores=0.9), sample(2, cores=0.9, uid=2001)), p,
                    set()) == []  # two users, each under the share


def test_exempt_commands_have_their_own_allowance() -> None:
    p = policy(cpu_share=0.1, exempt_commands=("cc1plus=0.5", "make"), command_cpu_share=0.2)
    build = [sample(i, "cc1plus", cores=1.0, exempt="cc1plus") for i in range(1, 5)]
    assert evaluate(snapshot(*build), p, set()) == []  # 40% of the node
    [finding] = evaluate(snapshot(*build, sample(9, "cc1plus", cores=2.0, exempt="cc1plus")),
                         p, set())
    assert finding.rule == "cpu:cc1plus" and finding.kind == "cpu" and finding.limit == 0.5
    [finding] = evaluate(snapshot(sample(1, "make", cores=3.0, exempt="make")), p, set())
    assert finding.rule == "cpu:make" and finding.limit == 0.2


def test_a_name_alone_earns_no_allowance() -> None:
    # Called make, but the scanner found its program is not the root file make is.
    p = policy(cpu_share=0.1, exempt_commands=("make=0.9",))
    [finding] = evaluate(snapshot(sample(1, "make", cores=3.0)), p, set())
    assert finding.rule == "cpu" and [t.pid for t in finding.targets] == [1]


def test_ended_children_count_for_their_parents_rule_and_unseen_cpu_for_the_general() -> None:
    p = policy(cpu_share=0.1, exempt_commands=("make=0.9",))
    # A real make idles while the recipes it ran and waited for burn 3 cores: a build,
    # within make's allowance...
    assert evaluate(snapshot(sample(1, "make", cores=0.0, exempt="make", children=3.0)),
                    p, set()) == []
    # ... and bounded by it.
    [finding] = evaluate(snapshot(sample(1, "make", cores=0.0, exempt="make",
                                         children=9.5)), p, set())
    assert finding.rule == "cpu:make" and finding.value == pytest.approx(0.95)
    # Anything else's ended children count against the general share.
    [finding] = evaluate(snapshot(sample(3, "python3", cores=0.0, children=3.0)), p, set())
    assert finding.rule == "cpu" and finding.value == pytest.approx(0.3)
    assert [t.pid for t in finding.targets] == [3] and "ended children" in finding.seen
    # A shell's loop of short burners: only the cgroup saw them; the shell is no target.
    [finding] = evaluate(snapshot(sample(2, "bash", cores=0.01), unseen={2000: 2.0}), p, set())
    assert finding.rule == "cpu" and finding.targets == ()
    assert "too short-lived to be seen" in finding.seen
    assert evaluate(snapshot(sample(2, "bash"), unseen={2000: 0.5}), p, set()) == []


def test_a_capped_user_still_breaks_the_rule_when_pinned_against_the_cap() -> None:
    p = policy(cpu_share=0.5, throttle_cpu_share=0.05)
    pinned = snapshot(sample(1, cores=0.5))  # 5% of 10 cores: all the cap allows
    assert evaluate(pinned, p, set()) == []
    [finding] = evaluate(pinned, p, set(), capped={2000})
    assert finding.limit == pytest.approx(0.045)


def test_memory_rule_targets_the_largest_until_under_the_cap() -> None:
    p = policy(memory_gib=4.0)
    found = evaluate(snapshot(sample(1, rss=3 * GIB), sample(2, rss=2 * GIB),
                              sample(3, "bash", rss=GIB // 2), sample(4, rss=GIB)), p, set())
    [finding] = found
    assert finding.rule == "memory"
    assert [t.pid for t in finding.targets] == [1]  # 6.5 - 3 = 3.5 GiB: under the cap
    assert "6.50 GiB" in finding.seen and "allowed 4.00 GiB" in finding.seen


def test_gpu_rule_flags_what_the_probe_lists_and_skips_without_an_answer() -> None:
    p = policy()
    procs = (sample(1, "python3"), sample(2, "python3"))
    [finding] = evaluate(snapshot(*procs), p, {2, 77})
    assert finding.rule == "gpu" and [t.pid for t in finding.targets] == [2]
    assert evaluate(snapshot(*procs), p, None) == []
    assert evaluate(snapshot(*procs), p, set()) == []


def test_ai_rule_by_signature_or_library_and_never_the_guard_itself() -> None:
    p = policy()
    found = evaluate(snapshot(sample(1, "torchrun", signature="torchrun"),
                              sample(2, "python3", ai_library="libcudart.so.12"),
                              sample(4242, "jobwrap", signature="torchrun"),
                              sample(3, "python3")), p, set())
    [finding] = found
    assert finding.rule == "ai"
    assert [t.pid for t in finding.targets] == [1, 2]
    assert "runs torchrun" in finding.seen and "has libcudart.so.12 loaded" in finding.seen


def test_a_launcher_is_told_before_many_processes_with_a_library_loaded() -> None:
    loaded = [sample(pid, "python3", ai_library="torch") for pid in range(1, 9)]
    [finding] = evaluate(snapshot(*loaded, sample(50, "torchrun", signature="torchrun")),
                         policy(), set())
    assert finding.seen.startswith("AI workload on a login node: 50 torchrun (runs torchrun)")


def test_accounts_never_touched() -> None:
    p = policy(min_uid=1000, exempt_users=("alice",), exempt_groups=(grp.getgrgid(0).gr_name,))
    assert p.ignores_account(0, "root", [])
    assert p.ignores_account(999, "daemon", [])
    assert p.ignores_account(1500, "alice", [])
    assert p.ignores_account(1501, "bob", [5000, 0])  # a member of an exempt group
    assert not p.ignores_account(1502, "carol", [5000])


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"cpu_share": 1.5}, "[login_guard] cpu_share = 1.5: expected a share"),
        ({"cpu_actions": ("warn", "nuke")}, "[login_guard] cpu_actions = ['warn', 'nuke']"),
        ({"ai_actions": ("warn", "warn")}, "expected distinct steps"),
        ({"exempt_commands": ("gcc=lots",)}, "exempt_commands: 'gcc=lots'"),
        ({"exempt_commands": ("=0.5",)}, "expected NAME or NAME=SHARE"),
        ({"throttle_nice": 25}, "throttle_nice = 25"),
        ({"exempt_groups": ("no-such-group-jw",)}, "no group named 'no-such-group-jw'"),
        ({"ai_commands": ("torchrun", "  ")}, "no empty signature"),
    ],
)
def test_bad_guard_settings_name_the_key(overrides: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        policy(**overrides)
    assert info.value.path == "test.toml"
    assert expected in str(info.value)


def test_every_problem_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        policy(cpu_share=2.0, throttle_nice=40, memory_actions=("explode",))
    assert len(info.value.problems) == 3


def test_printable_defuses_terminal_escapes() -> None:
    assert printable("evil\x1b]0;owned\x07name") == "evil?]0;owned?name"
    assert len(printable("x" * 500, 20)) == 20


def test_default_policy_builds_and_protects_sessions() -> None:
    p = policy()
    assert {"sshd", "bash", "tmux: server"} <= p.protected_commands
    assert p.is_protected(sample(10, "sshd")) and p.is_protected(sample(4242, "jobwrap"))
    assert not p.is_protected(sample(11, "python3"))
    assert p.ladder("cpu") == ("warn", "throttle", "terminate")


@pytest.mark.parametrize(
    ("name", "binary", "system", "session"),
    [
        ("sshd", "sshd", True, True),
        ("sshd-session", "sshd-session", True, True),
        ("bash", "bash", True, True),
        ("sh", "dash", True, True),  # /bin/sh is dash on Debian
        ("ksh", "ksh93", True, True),
        ("tmux: server", "tmux", True, True),
        ("(sd-pam)", "systemd", True, True),
        ("sshd", "python3.11", True, False),  # a symlink named sshd to an interpreter
        ("bash", "bash", False, False),  # a copy the user owns (or can write)
        ("bash", None, False, True),  # unreadable: protecting a session matters more
        ("python3", "python3.11", True, False),
    ],
)
def test_a_session_is_told_by_its_program_not_its_name(name: str, binary: str | None,
                                                       system: bool, session: bool) -> None:
    assert policy().is_session(name, binary, system) is session
