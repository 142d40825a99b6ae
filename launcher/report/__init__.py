"""Reports: Tables 3-4 and plots from result.json files, achieved placement, the paper's numbers, wandb."""
