"""Validation of the simulator against the real executor (`sim validate`, the matrix).

- cases.py: the matrix (workload + policy + executor mode + what to compare);
- modes.py: executor modes, the hook through which feature executors (speculation, Medusa,
  offload) plug in and hand their recorded statistics to the simulator;
- calibrate.py / features.py: the executor fit, from held-out executor runs;
- measured.py: reading run directories back; simulate.py: the simulator on the executor's
  exact requests and policies; compare.py / metrics.py: the errors and their sources;
- rule.py: the pass rule (local-speed per-iteration MAPE on CPU, aggregates on the median of
  the repeats);
- report.py / plots.py: the per-case report and the matrix table; run.py: one case;
  matrix.py: the whole matrix (`python -m infersim.analysis.validate.matrix`); sentinel.py: the
  optional machine-speed correction."""
