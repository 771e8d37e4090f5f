"""Calibration from measured kernel tables (`sim calibrate`): table kinds, the kernel time
models the cost model prices operators with, and their fits."""
