"""fedshard training core: one entrypoint for FSDP, HSDP, FL+FSDP and FL+HSDP (no Hydra here)."""
