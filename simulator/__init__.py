"""infersim's model of the world: model specs, hardware profiles, the cost model, workloads,
policies, the SimPy serving engine and its metrics."""

__version__ = "0.1.0"
