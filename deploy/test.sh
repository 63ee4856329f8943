#!/usr/bin/env bash
# Sets up (deploy/setup.sh) and runs the whole test suite with ctest: unit tests, the
# checkpoint fixtures made by transformers, and the end-to-end test with real processes.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${GATEHOUSE_BUILD_DIR:-$ROOT/build}
"$ROOT/deploy/setup.sh"
cd "$BUILD_DIR"
ctest --output-on-failure --timeout 1800 -j "$(nproc)" "$@"
