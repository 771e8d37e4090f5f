#!/usr/bin/env bash
# The CUDA paths on a real GPU, in one go: the CUDA-marked tests (the engine on the GPU gives the
# CPU's greedy tokens), the projection GEMMs of seven public models timed for the shipped
# profile's out-of-sample check (kernels_on_this_gpu.py), `sim profile --device cuda --quick`
# with the zoo target's own predictor, and `sim validate --device cuda` on the plain-load case
# (CASES="plain-load preempt-swap ..." for more). STEPS picks the steps (default all four:
# "tests kernels profile validate"), so a short device session can spend its minutes on the
# validation cases alone.
# Each step has its own time limit and log; a failed step does not stop the next.
#
#     bash benchmarks/cuda_checks.sh OUTDIR        # SIM="python -m infersim.cli.main" if `sim` is not on PATH
#     STEPS=validate CASES="preempt-swap medusa-tree" bash benchmarks/cuda_checks.sh OUTDIR
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bash benchmarks/cuda_checks.sh OUTDIR}
SIM=${SIM:-sim}
PY=${PYTHON:-python3}
mkdir -p "$OUT"

STEPS=${STEPS:-tests kernels profile validate}
wanted() { [[ " $STEPS " == *" $1 "* ]]; }

step() {
  local name=$1 limit=$2 start rc
  shift 2
  start=$(date +%s)
  echo "== $name (limit ${limit} s): $*"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  echo "$name rc=$rc $(($(date +%s) - start)) s" | tee -a "$OUT/steps.txt"
  tail -n 8 "$OUT/$name.log"
}

nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
# the card's memory as the driver reports it (what vLLM sizes its KV cache from), beside the
# profile's datasheet memory_gb
$PY -c "import torch; free, total = torch.cuda.mem_get_info(); print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), 'total_bytes', total, 'free_bytes', free)" | tee "$OUT/torch.txt"
if wanted tests; then
  step pytest-cuda "${LIMIT_TESTS:-120}" $PY -m pytest -m cuda -n 0 -p no:cacheprovider tests/executor/test_executor.py
fi
if wanted kernels; then
  step kernels "${LIMIT_KERNELS:-150}" $PY benchmarks/kernels_on_this_gpu.py measure --out "$OUT/kernels.csv"
fi
if wanted profile; then
  mkdir -p "$OUT/profile"
  step profile "${LIMIT_PROFILE:-200}" $SIM profile --device cuda --quick --model zoo-target --out "$OUT/profile/cuda-quick.yaml"
fi
# CASES: the validation cases to run (default plain-load; `sim validate --list` names them all)
if wanted validate; then
  for case in ${CASES:-plain-load}; do
    step "validate-$case" "${LIMIT_VALIDATE:-160}" $SIM validate --device cuda --case "$case" --out "$OUT/validate-$case" -q
  done
fi
touch "$OUT/steps.txt"
cat "$OUT/steps.txt"
