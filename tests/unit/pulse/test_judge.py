"""The hang judge on samples as the nodes send them (pure), and which processes are ranks.

Each case is a sequence of rounds 3 s apart (the default sample interval), with the default
floor (15 s) and k (2). The five cases the judge must never call a hang run for at least
twice the floor."""

from __future__ import annotations

from typing import Any

from wrapper.pulse.judge import HangJudge, Verdict
from wrapper.watch.ranks import pick_ranks, where

STEP = 3.0


def rank(pid: int, *, coll: bool, cpu: float = 1.0, io: int = 0, sig: str = "s",
         at: str = "f (x.py:1)", d: bool = False, err: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"pid": pid, "rank": str(pid), "cpu": cpu, "io": io, "d": d}
    if err:
        out["err"] = err
    else:
        out.update({"coll": coll, "sig": sig, "at": at})
    return out


def play(rounds: list[dict[str, list[dict[str, Any]]]], judge: HangJudge | None = None,
         late: dict[int, str] | None = None) -> tuple[HangJudge, list[tuple[float, Verdict]]]:
    """Feed ``rounds`` (node -> ranks) to a judge; ``late``: round index -> a node whose
    sample is late then. The verdicts, with the time each came."""
    judge = judge or HangJudge(floor=15.0, k=2.0, interval=STEP)
    verdicts = []
    for i, by_node in enumerate(rounds):
        now = 1000.0 + i * STEP
        samples = {n: (now - (10 * STEP if late and late.get(i) == n else 0.1),
                       {"node": n, "ranks": ranks}) for n, ranks in by_node.items()}
        v = judge.round(now, samples, sorted(by_node))
        if v is not None:
            verdicts.append((now - 1000.0, v))
    return judge, verdicts


def stuck_rounds(n: int, *, start: int = 0) -> list[dict[str, list[dict[str, Any]]]]:
    """Rank 1 on n2 sleeps (no CPU, no I/O, one stack) while rank 0 on n1 waits in the
    all-reduce, from round ``start`` on; before that both train."""
    out = []
    for i in range(n):
        if i < start:
            out.append({"n1": [rank(10, coll=False, cpu=i, sig=f"a{i}")],
                        "n2": [rank(20, coll=False, cpu=i, sig=f"b{i}")]})
        else:
            out.append({"n1": [rank(10, coll=True, cpu=start, sig="wait")],
                        "n2": [rank(20, coll=False, cpu=start, sig="sleep",
                                    at="<module> (train.py:40)")]})
    return out


def test_a_rank_that_neither_joins_nor_moves_is_named_once_the_floor_has_passed() -> None:
    _, verdicts = play(stuck_rounds(14, start=2))
    assert len(verdicts) == 1
    at, v = verdicts[0]
    # stuck from round 2 (t=6; first seen stuck at t=9, counted from t=6): 15 s later
    assert at == 21.0
    assert [(s["node"], s["rank"], s["at"]) for s in v.stuck] == \
        [("n2", "20", "<module> (train.py:40)")]
    assert (v.waiting, v.ranks, v.held_s, v.window_s) == (1, 2, 15.0, 15.0)


def test_the_stuck_rank_is_named_among_16() -> None:
    rounds = []
    for _ in range(10):
        ranks = {f"n{n}": [rank(n * 10 + j, coll=True, cpu=5.0, sig="w")
                           for j in range(8)] for n in (1, 2)}
        ranks["n2"][5] = rank(25, coll=False, cpu=5.0, sig="stuck", at="load (data.py:9)")
        rounds.append(ranks)
    _, verdicts = play(rounds)
    assert len(verdicts) == 1 and [s["pid"] for s in verdicts[0][1].stuck] == [25]
    assert verdicts[0][1].waiting == 15


def test_a_rank_writing_a_checkpoint_while_the_others_wait_is_no_hang() -> None:
    rounds = [{"n1": [rank(10, coll=False, io=i * 50 << 20, sig="save", at="save (t.py:3)")],
               "n2": [rank(20, coll=True, sig="barrier")]} for i in range(24)]  # 72 s
    assert play(rounds)[1] == []


def test_a_checkpoint_written_in_one_stalled_call_is_no_hang() -> None:
    rounds = [{"n1": [rank(10, coll=False, sig="save", d=True)],
               "n2": [rank(20, coll=True, sig="barrier")]} for i in range(24)]
    assert play(rounds)[1] == []


def test_every_rank_stalled_on_its_data_loader_is_no_hang() -> None:
    rounds = [{"n1": [rank(10, coll=False, sig="next")], "n2": [rank(20, coll=False,
                                                                    sig="next")]}
              for _ in range(24)]
    assert play(rounds)[1] == []


def test_a_first_step_that_compiles_is_no_hang() -> None:
    rounds = [{"n1": [rank(10, coll=False, cpu=i * 2.9, sig="compile")],
               "n2": [rank(20, coll=True, sig="wait")]} for i in range(34)]  # 102 s
    assert play(rounds)[1] == []


def test_one_rank_evaluating_while_the_others_wait_is_no_hang() -> None:
    rounds = [{"n1": [rank(10, coll=False, cpu=i * 3.0, sig=f"eval{i % 3}")],
               "n2": [rank(20, coll=True, sig="wait"), rank(21, coll=True, sig="wait")]}
              for i in range(24)]
    assert play(rounds)[1] == []


def test_a_one_process_job_is_never_judged() -> None:
    rounds = [{"n1": [rank(10, coll=False, sig="sleep")]} for _ in range(24)]
    assert play(rounds)[1] == []


def test_a_late_node_makes_the_round_blind_and_the_count_starts_again() -> None:
    rounds = stuck_rounds(14, start=0)
    _, verdicts = play(rounds, late={4: "n2"})
    # without the late round: a verdict at t=15 (stuck from t=0); with it, the count
    # starts again from the blind round (t=12)
    assert [at for at, _ in verdicts] == [27.0]
    assert [at for at, _ in play(rounds)[1]] == [15.0]


def test_a_stretch_that_ended_by_itself_lengthens_the_window() -> None:
    judge, verdicts = play(stuck_rounds(5, start=0) + stuck_rounds(3, start=3))
    assert verdicts == [] and judge.longest == 15.0 and judge.window == 30.0
    _, verdicts = play(stuck_rounds(14, start=0), judge=judge)
    assert [v.window_s for _, v in verdicts] == [30.0]


def test_a_rank_whose_stack_is_unread_but_moves_keeps_the_job_alive() -> None:
    rounds = [{"n1": [rank(10, coll=True, sig="wait")],
               "n2": [rank(20, coll=False, sig="x"), rank(21, coll=False, cpu=i, err="no")]}
              for i in range(12)]
    assert play(rounds)[1] == []


def test_every_rank_in_a_collective_none_moving_names_the_one_apart() -> None:
    rounds = [{"n1": [rank(10, coll=True, at="all_reduce (t.py:5)"),
                      rank(11, coll=True, at="all_reduce (t.py:5)")],
               "n2": [rank(20, coll=True, at="barrier (t.py:9)")]} for _ in range(8)]
    _, verdicts = play(rounds)
    assert [[s["pid"] for s in v.stuck] for _, v in verdicts] == [[20]]


def test_ranks_busy_inside_a_collective_are_no_hang() -> None:
    rounds = [{"n1": [rank(10, coll=True, cpu=i * 3.0)], "n2": [rank(20, coll=True,
                                                                    cpu=i * 3.0)]}
              for i in range(12)]
    assert play(rounds)[1] == []


# -- which processes are ranks --------------------------------------------------------------
def proc(pid: int, ppid: int, exe: str = "python3.11", label: str = "",
         cmd: bytes = b"python\0train.py") -> dict[str, Any]:
    return {"pid": pid, "ppid": ppid, "exe": exe, "label": label, "argv": cmd}


def test_torchruns_workers_are_the_ranks_with_their_data_loaders() -> None:
    procs = [proc(1, 0, exe="bash", cmd=b"bash\0script"),
             proc(2, 1, cmd=b"python\0torchrun\0train.py"),  # the agent: no RANK
             proc(3, 2, label="RANK=0"), proc(4, 2, label="RANK=1"),
             proc(5, 3, label="RANK=0"), proc(6, 3, label="RANK=0"),  # rank 0's loaders
             proc(7, 4, exe="sleep", cmd=b"sleep\0100")]
    assert pick_ranks(procs) == {3: [5, 6], 4: [7]}


def test_spawned_ranks_without_a_rank_variable_are_found_under_their_launcher() -> None:
    spawn = b"python\0-c\0from multiprocessing.spawn import spawn_main"
    procs = [proc(1, 0, exe="bash", cmd=b"bash\0script"),
             proc(2, 1, cmd=b"python\0train.py"),  # mp.spawn's parent
             proc(3, 2, cmd=spawn), proc(4, 2, cmd=spawn),
             proc(5, 2, cmd=b"python\0-c\0from multiprocessing.resource_tracker import main"),
             proc(6, 3, cmd=spawn)]  # rank 3's fork child (same command line)
    assert pick_ranks(procs) == {3: [6], 4: []}


def test_a_plain_one_process_job_is_its_own_rank() -> None:
    procs = [proc(1, 0, exe="bash", cmd=b"bash\0script"), proc(2, 1)]
    assert pick_ranks(procs) == {2: []}


def test_a_shell_or_sleep_is_never_a_rank() -> None:
    procs = [proc(1, 0, exe="bash", label="RANK=0"), proc(2, 1, exe="sleep")]
    assert pick_ranks(procs) == {}


# -- where a rank is, from py-spy's JSON -------------------------------------------------------
def frames(*names_files: tuple[str, str]) -> list[dict[str, Any]]:
    return [{"name": n, "filename": f, "short_filename": f, "line": 1} for n, f in names_files]


def test_ddp_waiting_for_its_gradients_is_inside_a_collective_only_when_idle() -> None:
    stack = frames(("_engine_run_backward", "/v/torch/autograd/graph.py"),
                   ("<module>", "/u/t.py"))
    idle = [{"os_thread_id": 5, "active": False, "frames": stack}]
    busy = [{"os_thread_id": 5, "active": True, "frames": stack}]
    assert where(idle, 5)["coll"] is True
    assert where(busy, 5)["coll"] is False


def test_a_rank_meeting_its_peers_is_starting_not_waiting() -> None:
    stack = frames(("wait", "/v/torch/distributed/rendezvous.py"),
                   ("init_process_group", "/v/torch/distributed/distributed_c10d.py"))
    assert where([{"os_thread_id": 5, "active": False, "frames": stack}], 5)["coll"] is False
    stack = frames(("barrier", "/v/torch/distributed/distributed_c10d.py"))
    assert where([{"os_thread_id": 5, "active": False, "frames": stack}], 5)["coll"] is True


def test_a_rank_waiting_on_its_data_loaders_queue_is_not_in_a_collective() -> None:
    stack = frames(("wait", "/usr/lib/python3.11/threading.py"),
                   ("get", "/usr/lib/python3.11/multiprocessing/queues.py"),
                   ("_next_data", "/v/torch/utils/data/dataloader.py"))
    assert where([{"os_thread_id": 5, "active": False, "frames": stack}], 5)["coll"] is False

