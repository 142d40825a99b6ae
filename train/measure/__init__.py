"""What a run measures and what is measured before it: phase timers and rank-reduced metrics, exposed
communication, energy, profiles, compute calibration, collective probes and the fake-tensor dry-run."""
