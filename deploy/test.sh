#!/usr/bin/env bash
# Sets up (deploy/setup.sh) and runs the whole test suite with ctest: unit tests, the
# checkpoint fixtures made by transformers, and the end-to-end test with real processes.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${GATEHOUSE_BUILD_DIR:-$ROOT/build}
"$ROOT/deploy/setup.sh"
cd "$BUILD_DIR"
# Tests run two at a time, most of them LibTorch processes with an OpenMP pool each: spinning
# idle threads then steal the cores the other test needs (two fixture generators side by side
# took 45 s instead of 9). Passive waiting changes no result, only who gets the cores.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
ctest --output-on-failure --timeout 1800 -j "$(nproc)" "$@"
