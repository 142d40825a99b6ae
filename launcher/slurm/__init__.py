"""SLURM: hostlists, the scontrol/squeue queries and their parsers, submission, in-job rank placement."""
