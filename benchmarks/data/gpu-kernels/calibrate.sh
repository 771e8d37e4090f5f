#!/usr/bin/env bash
# Fits the shipped a100-80gb-sxm, a40 and h100-sxm profiles from the tables beside this file:
# the kernel models and measured GEMM shapes from linear_ops, then the collectives.
#   bash benchmarks/data/gpu-kernels/calibrate.sh [OUT_DIR]   (default: hwprofiles/)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/../../../hwprofiles}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
vidur="microsoft/vidur profiling data"
licence="MIT License, Copyright (c) Microsoft Corporation, https://github.com/microsoft/vidur"
for setup in "a100-80gb-sxm a100 a100_dgx" "a40 a40 a40_pairwise_nvlink" "h100-sxm h100 h100_dgx"; do
  set -- $setup
  sim calibrate "$here/linear_ops.csv.gz" --hardware "$1:datasheet" --device "$2" \
    --source "$vidur, $licence (linear_ops: per-layer operator medians, fp16)" --out "$tmp/$1.yaml"
  sim calibrate "$here/collectives.csv.gz" --hardware "$tmp/$1.yaml" --device "$3" \
    --source "$vidur (data/profiling/network/, commit 7d47513), $licence" --out "$out/$1.yaml" --force
done
