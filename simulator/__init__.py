"""infersim's model of the world: model specs, hardware profiles, the cost model, workloads,
policies, the SimPy serving engine and its metrics."""

from infersim import __version__  # noqa: F401  (one version, in the package root)
