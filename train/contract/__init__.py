"""The contract between the launcher and the trainer, torch-free: the run spec and its config sections, the result
schema, the model presets, the strategy table and the Layout, the errors both sides report as one line, and the
files they agree on (prepared data's index, submitit's task files). The launcher imports nothing else from train/
but the job entry point (train.job)."""
