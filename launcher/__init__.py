"""The launcher pipeline, in order: settings (config) -> sweep -> plan (placement) -> run (submit, wait) -> report."""
