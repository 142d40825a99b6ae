"""What keeps a run alive on its machine: rank environment and rendezvous, local and forked ranks, checkpoints,
pre-emption, the step watchdog, the non-finite guard and submitit's private API."""
