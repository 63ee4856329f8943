#!/usr/bin/env bash
# The prepared GPU check (issue 4): on a machine with an NVIDIA GPU and a Python whose torch is
# the CUDA build the nodes run (2.11, CUDA 13) with transformers and safetensors, builds the
# worker side only (GATEHOUSE_BUILD_SERVICES=OFF) against that torch, makes three tiny
# fixtures, runs the CUDA tests (the CUDA-graph runner against eager decode) and every gate for
# two families at TP=1 in bf16 and fp32 in mode cuda_graph, and prints the figures.
#
#   tools/gpu/gpu_check.sh [OUT_DIR]          (PYTHON=/path/to/python to choose the Python)
#
# Writes OUT_DIR/{gpu.txt,tests.txt,gates.md,events.json}; default OUT_DIR var/gpu-check.
# Needs cmake, ninja, a C++20 compiler and the worker's headers (nlohmann-json, spdlog, fmt,
# CLI11, gloo, GoogleTest, OpenSSL). Never prints a figure it did not measure: a gate that
# cannot run says SKIPPED or BLOCKED with the reason.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${1:-$ROOT/var/gpu-check}
PY=${PYTHON:-python3}
BUILD=${GATEHOUSE_GPU_BUILD_DIR:-$ROOT/build-gpu}
mkdir -p "$OUT"

nvidia-smi --query-gpu=name,memory.total,driver_version,uuid --format=csv | tee "$OUT/gpu.txt"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"nccl", ".".join(map(str, torch.cuda.nccl.version())), "devices", torch.cuda.device_count())' \
  | tee -a "$OUT/gpu.txt"

TORCH_PREFIX=$("$PY" -c 'import torch;print(torch.utils.cmake_prefix_path)')
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGATEHOUSE_BUILD_SERVICES=OFF \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DGATEHOUSE_PYTHON="$PY" >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target gatehouse-worker gatehouse_models static_decode_test
# The runtime the agent would register (torch, CUDA, cuDNN, NCCL, driver; docs/protocols.md §3.2).
"$BUILD/bin/gatehouse-worker" --print-runtime | tee -a "$OUT/gpu.txt"

VARIANTS=(llama-tiny-untied qwen2-tiny-sliding qwen3-tiny-untied)
"$PY" "$ROOT/tools/refgen/make_checkpoint.py" --out-root "$BUILD/testdata" --only "${VARIANTS[@]}" \
  >/dev/null 2>&1

# The CUDA-graph runner against eager decode on the GPU (qwen2-tiny-sliding, fp32 and bf16).
"$BUILD/tests/models/static_decode_test" --gtest_filter='CudaGraphTest.*' \
  2>&1 | tee "$OUT/tests.txt" | grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) ' || true

"$PY" "$ROOT/tools/gpu/run_gates.py" --build-dir "$BUILD" --testdata "$BUILD/testdata" \
  --device cuda --mode cuda_graph --precision bf16 fp32 \
  --variant llama-tiny-untied:llama qwen3-tiny-untied:qwen3 --json "$OUT/events.json" \
  | tee "$OUT/gates.md"
