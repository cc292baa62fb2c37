"""The test cluster itself: srun runs each task on its own node, in that node's network."""

from __future__ import annotations

from tests.slurm.cluster import SlurmCluster


def test_srun_runs_each_task_on_its_node(slurm: SlurmCluster) -> None:
    done = slurm.run(["srun", "-N3", "-l", "sh", "-c",
                      "echo $SLURMD_NODENAME $(ip -4 -o addr show eth0 | cut -d' ' -f7)"])
    lines = sorted(line.split(": ", 1)[1] for line in done.stdout.splitlines())
    assert lines == [f"{n.name} {n.addr}/24" for n in slurm.nodes]
