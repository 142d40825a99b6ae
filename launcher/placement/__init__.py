"""Placement: the topology tree, allocation of F x R x S onto it, the cost model, ranking of layouts."""
