"""What crosses the federation links every A steps: FedAvg, DiLoCo's outer step, compressed and in-flight
exchanges, and the guard that groups average corresponding shard slices."""
