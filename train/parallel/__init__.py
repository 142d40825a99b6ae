"""How a run's ranks split the model: the strategy table and the parallel dimensions (F, R, S, pp, tp), the device
mesh, tensor and pipeline parallelism, and FSDP2 sharding."""
