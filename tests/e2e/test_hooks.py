"""Every hook runs on every node of a real 2-node GPU job, as Slurm runs them."""

from __future__ import annotations

from jobwrap_dev.sandbox.cluster import Cluster
from wrapper.slurm.parse import expand_hostlist

JOB = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:2
#SBATCH --output=hooks-%j.out
srun bash -c 'echo "$SLURMD_NODENAME attempt=$JOBWRAP_ATTEMPT scratch=$JOBWRAP_SCRATCH"'
"""


def test_two_node_gpu_job_as_user(cluster: Cluster) -> None:
    job_id = cluster.submit(JOB, name="hooks.sh")
    info = cluster.wait_job(job_id)
    assert info["JobState"] == "COMPLETED", info
    user = cluster.spec.user

    events = [e for e in cluster.events(job_id)
              if e["event"].endswith(".context")]
    by_hook: dict[str, set[str]] = {}
    for event in events:
        ctx = event["context"]
        assert ctx["job_id"] == job_id
        assert ctx["user"] == user
        assert ctx["gpus"] == [0, 1], event
        by_hook.setdefault(ctx["hook"], set()).add(ctx["node"])
        assert event["node"] == ctx["node"]
    nodes = expand_hostlist(info["NodeList"])  # wherever Slurm put it: two nodes
    assert len(nodes) == 2 and by_hook == {hook: set(nodes) for hook in
                                           ("prolog", "task-prolog", "epilog")}, by_hook
    # root's hooks wrote root's file; the user's hook wrote the user's file only
    for event in events:
        assert event["source"] == ("user" if event["context"]["hook"] == "task-prolog"
                                   else "root")
        if event["source"] == "root" and event["event"] == "prolog.context":
            assert event["context"]["uid"] is not None

    out = (cluster.work / f"hooks-{job_id}.out").read_text().split("\n")
    lines = sorted(line for line in out if line)
    # each node its own scratch, under its own folder
    assert lines == [f"{n} attempt=0 scratch={cluster.scratch_of(n) / job_id}"
                     for n in sorted(nodes)]
    # each node's state folder holds what that node's hooks wrote, and nothing of the other's
    for node in nodes:
        own = cluster.job_state(job_id, node).events()
        assert own and {e["node"] for e in own if e.get("node")} == {node}, (node, own)


def test_no_two_sandbox_nodes_share_a_folder_a_real_node_keeps_to_itself(
        cluster: Cluster) -> None:
    """The config every node reads (as shipped to slurmd's hooks) gives each node its own
    state, scratch, cache, log and metrics, and all of them the one archive."""
    from wrapper import config
    from wrapper.config import NODE_LOCAL

    loaded = {n: config.load(str(cluster.jobwrap_config), env={}, node=n)
              for n in cluster.spec.nodes}
    assert len(loaded) >= 2
    for section, key in NODE_LOCAL:
        paths = [getattr(getattr(cfg, section), key) for cfg in loaded.values()]
        assert all(paths) and len(set(paths)) == len(paths), (section, key, paths)
        assert not any(p.startswith(q.rstrip("/") + "/") for p in paths for q in paths
                       if p != q), paths  # nor one inside another's
    assert len({cfg.paths.archive_root for cfg in loaded.values()}) == 1
    assert loaded["n1"].paths.state_dir == str(cluster.state_of("n1"))


def test_bad_jobwrap_config_never_drains_a_node(cluster: Cluster) -> None:
    """A broken jobwrap config is jobwrap's fault, not the node's: the job runs."""
    original = cluster.jobwrap_config.read_text()
    cluster.jobwrap_config.write_text(original + "\n[nonsense]\nkey = 1\n")
    try:
        job_id = cluster.submit("#!/bin/bash\necho ran on $SLURMD_NODENAME\n",
                                "--output=badcfg-%j.out", name="badcfg.sh")
        info = cluster.wait_job(job_id)
    finally:
        cluster.jobwrap_config.write_text(original)
    assert info["JobState"] == "COMPLETED", info
    assert "ran on n" in (cluster.work / f"badcfg-{job_id}.out").read_text()
    states = cluster.node_states()
    assert all(not s.startswith(("drain", "down")) for s in states.values()), states
