"""Starting worker processes: the Launcher protocol and its plugins (local subprocesses,
SSH, Slurm's srun, elasticrun agents)."""
