"""fedshard training core (no Hydra here): the torch-free contract with the launcher (contract/), the rooms
that train (data/, runtime/, parallel/, federation/, measure/, the loop) and the jobs the launcher runs (job/)."""
