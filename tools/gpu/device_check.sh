#!/usr/bin/env bash
# The GPU check over a prebuilt pack (tools/gpu/pack_prebuilt.sh), for a GPU machine that has
# an NVIDIA driver, CUDA 13 and a python3 with torch 2.11 (cu130) and transformers, but not the
# worker's build dependencies. gpu_check.sh is the same check for a machine that can build.
#
#   tools/gpu/device_check.sh [OUT_DIR]       (PACK=.gpu, PYTHON=python3; default OUT var/gpu-check)
#
# It recreates, as links, the paths compiled into the pack (the build tree, the venv's
# torch/lib and python), puts only the shared libraries this machine lacks on
# LD_LIBRARY_PATH, and runs, each under a time limit:
#   1. nvidia-smi, torch's view of the GPU, `gatehouse-worker --print-runtime`;
#   2. the CUDA-graph runner against eager decode (static_decode_test CudaGraphTest.*);
#   3. the agent's capability probe and the cleanup check against the real nvidia-smi;
#   4. every gate, mode cuda_graph, with transformers on this GPU as the performance peer:
#      llama and qwen3 in bf16 and fp32, then one fixture of every other family in bf16.
# Writes OUT/{gpu.txt,tests.txt,gates.md,families.md,events.json,families.json,summary.txt}.
# Never prints a figure it did not measure; a step that cannot run says so.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PACK=$(cd "${PACK:-$ROOT/.gpu}" && pwd)
OUT=${1:-$ROOT/var/gpu-check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
step() {  # step NAME SECONDS LOG COMMAND...: runs it, records its exit status and wall time
  local name=$1 limit=$2 log=$3; shift 3
  local t0=$SECONDS rc
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  printf '%-28s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$(basename "$log")" \
    | tee -a "$SUMMARY"
  return $rc
}

# Paths compiled into the pack: the build tree, the source tree, the venv.
source "$PACK/paths.env"  # BUILT_SOURCE, BUILT_BUILD, BUILT_TORCH_LIB, BUILT_PYTHON
link() {  # link TARGET PATH: PATH -> TARGET, unless PATH already resolves to TARGET
  [ "$(readlink -f "$2" 2>/dev/null)" = "$(readlink -f "$1")" ] && return 0
  if [ -e "$2" ]; then echo "$2 exists and is not $1: not touching it" >&2; return 1; fi
  mkdir -p "$(dirname "$2")" && ln -s "$1" "$2"
}
[ -e "$BUILT_SOURCE" ] || link "$ROOT" "$BUILT_SOURCE"
link "$PACK" "$BUILT_BUILD"
TORCH_LIB=$("$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
link "$TORCH_LIB" "$BUILT_TORCH_LIB"
if [ ! -e "$BUILT_PYTHON" ]; then
  mkdir -p "$(dirname "$BUILT_PYTHON")"
  printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v "$PY")" >"$BUILT_PYTHON"
  chmod +x "$BUILT_PYTHON"
fi
# Only the libraries this machine does not have (its own libcrypto, libz, ... come first).
MISSING=$(mktemp -d /tmp/gatehouse-missing-libs.XXXXXX)

HAVE=$(ldconfig -p | awk 'NR > 1 {print $1}')
for lib in "$PACK"/syslib/*.so*; do
  grep -qxF "$(basename "$lib")" <<<"$HAVE" || ln -s "$lib" "$MISSING/"
done
export LD_LIBRARY_PATH=$MISSING:$TORCH_LIB:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}:$PACK/syslib/cuda
echo "libraries taken from the pack: $(ls "$MISSING" | tr '\n' ' ')" | tee -a "$SUMMARY"
ldd "$PACK/bin/gatehouse-worker" "$PACK/lib/libgatehouse_models.so" | grep "not found" \
  | tee -a "$SUMMARY"

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,uuid --format=csv
  "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda,
"nccl", ".".join(map(str, torch.cuda.nccl.version())), "devices", torch.cuda.device_count(),
"transformers", transformers.__version__)'
  "$PACK/bin/gatehouse-worker" --print-runtime
} >"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

step "cuda_graph tests" 120 "$OUT/tests.txt" \
  "$PACK/tests/models/static_decode_test" --gtest_filter='CudaGraphTest.*'
grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) ' "$OUT/tests.txt"
GATEHOUSE_TEST_PYTHON=$(command -v "$PY") step "agent capabilities+cleanup" 120 "$OUT/agent.txt" \
  "$PACK/tests/agent/agent_test" --gtest_filter='CapabilitiesTest.*:CleanupTest.*'
grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) ' "$OUT/agent.txt"

export GATEHOUSE_PEER_PYTHON
GATEHOUSE_PEER_PYTHON=$(command -v "$PY")
step "gates llama,qwen3 bf16+fp32" 240 "$OUT/gates.md" \
  "$PY" "$ROOT/tools/gpu/run_gates.py" --build-dir "$PACK" --testdata "$PACK/testdata" \
  --device cuda --mode cuda_graph --precision bf16 fp32 \
  --variant llama-tiny-untied:llama qwen3-tiny-untied:qwen3 --json "$OUT/events.json"
cat "$OUT/gates.md"
step "gates other families bf16" 220 "$OUT/families.md" \
  "$PY" "$ROOT/tools/gpu/run_gates.py" --build-dir "$PACK" --testdata "$PACK/testdata" \
  --device cuda --mode cuda_graph --precision bf16 \
  --variant qwen2-tiny-sliding:qwen2 mistral-tiny-untied:mistral gemma-tiny-untied:gemma \
  gemma2-tiny-untied:gemma2 gemma3-tiny-untied:gemma3 phi3-tiny-untied:phi3 \
  qwen3_moe-tiny-untied:qwen3_moe --json "$OUT/families.json"
cat "$OUT/families.md"
# Upstream's own spread on this GPU against the CPU bundles (docs/bars.md "one side on a GPU"):
# prompt logits with max abs, decode-step logits, greedy ids; one fixture per family plus the
# published configs' legacy forms.
FLOOR_VARIANTS="llama-tiny-untied qwen2-tiny-sliding qwen3-tiny-untied mistral-tiny-untied
  gemma-tiny-untied gemma2-tiny-untied gemma3-tiny-untied phi3-tiny-untied qwen3_moe-tiny-untied
  llama-real-llama3.2-1b-hub gemma3-real-gemma-3-1b-it-hub"
for dtype in bf16 fp32; do
  # shellcheck disable=SC2086
  step "upstream floor on cuda $dtype" 200 "$OUT/floor_$dtype.md" \
    "$PY" "$ROOT/tools/gpu/upstream_floor.py" --testdata "$PACK/testdata" --device cuda \
    --dtype "$dtype" --variant $FLOOR_VARIANTS --json "$OUT/floor_$dtype.json"
  cat "$OUT/floor_$dtype.md"
done
echo; cat "$SUMMARY"
