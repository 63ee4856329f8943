#!/usr/bin/env bash
# Sets up a Debian 12 machine for Gatehouse and builds it. Idempotent: a second run only checks
# and rebuilds what changed.
#   deploy/setup.sh [TARGET...]   Debian packages, project venv (.venv), CMake configure, and a
#                                 build of the TARGETs (default: everything, tests included)
# Environment: GATEHOUSE_BUILD_DIR (default <repo>/build), GATEHOUSE_VENV (default <repo>/.venv),
#              GATEHOUSE_JOBS (default: number of cores).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${GATEHOUSE_BUILD_DIR:-$ROOT/build}
VENV=${GATEHOUSE_VENV:-$ROOT/.venv}
JOBS=${GATEHOUSE_JOBS:-$(nproc)}
log() { printf '[setup] %s\n' "$*" >&2; }

# 1. Debian packages (googletest is on the Debian 12 image; libboost1.81-dev must not meet the
#    1.74 meta packages libboost-dev/libboost-all-dev, which conflict with it).
PACKAGES=(build-essential cmake ninja-build ccache pkg-config git python3-venv
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libboost1.81-dev libboost-json1.81-dev libboost-url1.81-dev libgit2-dev libspdlog-dev
  libfmt-dev nlohmann-json3-dev libsqlite3-dev zlib1g-dev libcli11-dev libssl-dev googletest libgtest-dev
  libgmock-dev curl libgloo-dev clang libclang-rt-14-dev openssl python3.11-dev systemd
  chromium chromium-driver python3-selenium debootstrap buildah podman runc patchelf
  slurm-wlm munge bubblewrap)
# libgloo-dev: declarations only, for c10d's ProcessGroupGloo.hpp (the torch wheel ships c10d's
# headers, not gloo's); the code comes from the wheel's libtorch_cpu (worker_lib distributed.h).
# python3.11-dev: libpython3.11 to embed, for the worker's Python lane (worker_lib/python_lane).
# clang + libclang-rt-14-dev (libclang_rt.fuzzer; apt only recommends it): the libFuzzer
# targets of tests/fuzz. systemd: systemd-analyze and systemd-sysusers check deploy/systemd
# (tests/deploy); nothing here runs systemd as a service manager. chromium, chromium-driver,
# python3-selenium: the dashboard's browser test (tests/web), with the system python3.
# debootstrap + buildah: deploy/images/build.sh makes the container images from Debian packages
# (no registry needed); podman runs the controller image in tests/deploy/test_images.py, with
# runc (podman's default crun refuses hybrid-cgroup hosts, e.g. inside a Docker container);
# patchelf relocates the agent image's binaries (build.sh --agent). slurm-wlm + munge: the Slurm
# engine's end-to-end test starts its own munged, slurmctld and slurmd on 127.0.0.1
# (tests/e2e/slurm_test.cc); the packages' services are not used. bubblewrap: the agent's
# per-attempt sandbox (--sandbox bwrap; tests/agent/sandbox_test.cc, the e2e test).
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. Project venv with the pinned torch / transformers / safetensors.
REQ="$ROOT/deploy/requirements.txt"
STAMP="$VENV/.gatehouse-requirements"
if [ ! -x "$VENV/bin/python" ]; then
  log "creating venv $VENV"
  python3 -m venv "$VENV"
fi
if ! cmp -s "$REQ" "$STAMP" 2>/dev/null; then
  log "installing Python requirements (torch 2.11 is large; pip's cache makes reruns fast)"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQ"
  cp "$REQ" "$STAMP"
fi
TORCH_PREFIX=$("$VENV/bin/python" -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null)

# 3. Configure and build (Ninja + ccache). Paths under the checkout are hashed relative to it,
#    so another clone of the same sources (CI, a second checkout) hits the same cache entries.
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
ccache --max-size=8G >/dev/null 2>&1 || true
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  log "configuring $BUILD_DIR"
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DGATEHOUSE_PYTHON="$VENV/bin/python" >/dev/null
fi
TARGETS=()
for t in "$@"; do TARGETS+=(--target "$t"); done
log "building ${*:-everything} ($JOBS jobs)"
cmake --build "$BUILD_DIR" -j "$JOBS" "${TARGETS[@]}" >&2
log "ready: $BUILD_DIR"
