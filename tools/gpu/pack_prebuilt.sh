#!/usr/bin/env bash
# Packs what this machine built for a GPU machine that has an NVIDIA driver, CUDA 13 and a
# Python with torch 2.11 (cu130) but none of the worker's build dependencies: the worker, the
# model plugin, the worker SDK, the CUDA-graph and agent test binaries (debug info stripped),
# the Debian shared libraries they need that are not glibc or LibTorch, and the fixtures the
# GPU check runs on. tools/gpu/device_check.sh runs it there.
#
#   tools/gpu/pack_prebuilt.sh [BUILD_DIR] [PACK_DIR]      (defaults: build, .gpu)
#
# The binaries keep their RUNPATH into BUILD_DIR and the venv's torch/lib; device_check.sh
# recreates those paths as links on the GPU machine (it never writes outside them).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
PACK=${2:-$ROOT/.gpu}
VARIANTS=(llama-tiny-untied qwen2-tiny-sliding qwen3-tiny-untied mistral-tiny-untied
          gemma-tiny-untied gemma2-tiny-untied gemma3-tiny-untied phi3-tiny-untied
          qwen3_moe-tiny-untied)

rm -rf "$PACK"
mkdir -p "$PACK"/{bin,lib,worker_lib,tests/models,tests/agent,syslib,testdata}
copy_stripped() { cp "$1" "$2" && strip --strip-debug "$2/$(basename "$1")"; }
copy_stripped "$BUILD/bin/gatehouse-worker" "$PACK/bin"
copy_stripped "$BUILD/lib/libgatehouse_models.so" "$PACK/lib"
copy_stripped "$BUILD/worker_lib/libgatehouse_worker_sdk.so" "$PACK/worker_lib"
copy_stripped "$BUILD/tests/models/static_decode_test" "$PACK/tests/models"
copy_stripped "$BUILD/tests/agent/agent_test" "$PACK/tests/agent"

# Shared libraries from the system's library folders, less glibc's own and the C++ runtime
# (the GPU machine's are newer and compatible); libcudart goes to syslib/cuda, used only as a
# last resort (the GPU machine's CUDA comes first).
mkdir -p "$PACK/syslib/cuda"
for bin in "$PACK"/bin/* "$PACK"/lib/* "$PACK"/worker_lib/* "$PACK"/tests/*/*; do
  ldd "$bin" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r soname path; do
  case "$soname" in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|libutil.so*|libresolv.so*|ld-linux*|\
    libstdc++.so*|libgcc_s.so*) continue ;;
  esac
  case "$path" in
    "$ROOT"/*|"$BUILD"/*) continue ;;             # torch from the venv, our own libraries
    /usr/local/cuda/*) cp -L "$path" "$PACK/syslib/cuda/$soname" ;;
    *) cp -L "$path" "$PACK/syslib/$soname" ;;
  esac
done

# The paths compiled into these binaries, for device_check.sh to recreate as links.
{
  echo "BUILT_SOURCE=$ROOT"
  echo "BUILT_BUILD=$BUILD"
  echo "BUILT_TORCH_LIB=$(readelf -d "$BUILD/bin/gatehouse-worker" | tr ':[]' '\n\n\n' | grep '/torch/lib$')"
  echo "BUILT_PYTHON=$(sed -n 's/^GATEHOUSE_PYTHON:FILEPATH=//p' "$BUILD/CMakeCache.txt")"
} >"$PACK/paths.env"
for v in "${VARIANTS[@]}"; do cp -r "$BUILD/testdata/$v" "$PACK/testdata/"; done
du -sh "$PACK"
