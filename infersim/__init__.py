"""infersim: a roofline performance modeler, a discrete-event serving simulator and a real
executor for LLM inference.

The code lives in the repository's top-level folders, installed under this one name:
`simulator/` is `infersim.simulator` (the model of the world), `executor/` is
`infersim.executor` (real tensors), `analysis/` is `infersim.analysis` (validation, planning,
sweeps, reports); `hwprofiles/` and `traces/` are the packaged data `infersim.hwprofiles` and
`infersim.traces` (see `[tool.setuptools]` in pyproject.toml)."""

__version__ = "0.1.0"
