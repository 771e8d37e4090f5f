"""Reproductions of the four papers' findings (AdaptiveLLM, Minions, Medusa, InfiniGen) with the simulator (one module per paper)."""
