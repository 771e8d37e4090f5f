"""Installed home of the data folders `hwprofiles/` and `traces/` (mapped in pyproject.toml)."""
