"""KV-cache offload to CPU memory with selective prefetch (FlexGen, H2O, INT4, InfiniGen)."""
