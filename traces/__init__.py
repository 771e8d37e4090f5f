"""Built-in workloads as YAML data (one file per workload)."""
