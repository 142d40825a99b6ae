"""What keeps a run alive on its machine: rank environment and rendezvous, local ranks, checkpoints, pre-emption,
the step watchdog, the non-finite guard, and how a job's process ends."""
