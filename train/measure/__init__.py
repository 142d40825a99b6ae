"""What a run measures and what is measured before it: phase timers and rank-reduced metrics, exposed
communication, energy, profiles, compute calibration and collective probes."""
