"""Reproductions of the seed papers' findings with the simulator (one module per paper)."""
