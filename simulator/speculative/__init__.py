"""Speculative decoding in the simulator: draft models (Minions) and Medusa heads."""
