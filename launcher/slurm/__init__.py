"""SLURM: hostlists, the scontrol/squeue queries and their parsers, the nodes' hardware."""
