"""Pipeline parallelism and multi-node placement: a replica's layers split over stages of a
tensor-parallel group each, placed on nodes of a cluster, with the engine's batches pipelined
through the stages as vLLM's virtual engines run them."""
