#!/usr/bin/env bash
# Controller load figures (issue 5), printed as one table; not a test. Runs real controller
# processes on 127.0.0.1 with bearer tokens on, in a scratch directory:
#   1. N simulated agents (gRPC, one connection each) and M cells submitted over REST by commit
#      SHA: submits/s, cells submitted and scheduled per second, submit-to-lease p50/p99;
#   2. a database seeded with 100,000 finished cells: REST GET p50/p99 under closed-loop load
#      (a cell, the first page of the list), and the dashboard's matrix page.
#   tools/loadbench/run.sh [--agents 1000] [--cells 5000] [--seeded 100000] [--seconds 10]
# Environment: GATEHOUSE_BUILD_DIR (default <repo>/build).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${GATEHOUSE_BUILD_DIR:-$ROOT/build}/bin
AGENTS=1000 CELLS=5000 SEEDED=100000 SECONDS_=10
while [ $# -gt 0 ]; do
  case "$1" in
    --agents) AGENTS=$2; shift 2 ;;
    --cells) CELLS=$2; shift 2 ;;
    --seeded) SEEDED=$2; shift 2 ;;
    --seconds) SECONDS_=$2; shift 2 ;;
    *) echo "usage: $0 [--agents N] [--cells N] [--seeded N] [--seconds S]" >&2; exit 2 ;;
  esac
done
WORK=$(mktemp -d /tmp/gatehouse-loadbench.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

# start_controller DB NAME: starts a controller, sets HTTP_PORT and GRPC_PORT.
start_controller() {
  "$BIN/gatehouse-controller" --db "$1" --http 127.0.0.1:0 --grpc 127.0.0.1:0 \
    --mirror-dir "$WORK/mirrors" --web-dir "$ROOT/web" >"$WORK/$2.out" 2>"$WORK/$2.err" &
  PIDS+=($!)
  for _ in $(seq 200); do
    HTTP_PORT=$(sed -n 's/.*http listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$WORK/$2.out")
    GRPC_PORT=$(sed -n 's/.*grpc listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$WORK/$2.out")
    [ -n "$HTTP_PORT" ] && [ -n "$GRPC_PORT" ] && return 0
    sleep 0.1
  done
  echo "controller $2 did not start:"; cat "$WORK/$2.err"; exit 1
}

# 1. Agents and submits. The adapter repository and checkpoint only need to exist (the
#    simulated agents end each attempt without running anything).
git init -q -b main "$WORK/adapter"
git -C "$WORK/adapter" -c user.name=bench -c user.email=bench@gatehouse.invalid commit -q --allow-empty -m bench
COMMIT=$(git -C "$WORK/adapter" rev-parse HEAD)
mkdir -p "$WORK/ckpt/checkpoint" "$WORK/ckpt/reference"
echo '{"model_type":"llama"}' >"$WORK/ckpt/checkpoint/config.json"
echo weights >"$WORK/ckpt/checkpoint/model.safetensors"
echo '{"format":"gatehouse-reference/2"}' >"$WORK/ckpt/reference/reference.json"
echo reference >"$WORK/ckpt/reference/reference.safetensors"
"$BIN/gatehouse-controller" --db "$WORK/a.db" tokens create --name bench --scopes read,submit >"$WORK/api.token" 2>/dev/null
"$BIN/gatehouse-controller" --db "$WORK/a.db" tokens create --name sim --kind agent >"$WORK/agent.token" 2>/dev/null
start_controller "$WORK/a.db" a
echo "== $AGENTS simulated agents, $CELLS cells (controller pid ${PIDS[-1]})"
"$BIN/gatehouse-controller-bench" agents --grpc "127.0.0.1:$GRPC_PORT" --http-port "$HTTP_PORT" \
  --agents "$AGENTS" --cells "$CELLS" --api-token-file "$WORK/api.token" \
  --agent-token-file "$WORK/agent.token" --repository "$WORK/adapter" --commit "$COMMIT" \
  --checkpoint "$WORK/ckpt/checkpoint" --reference "$WORK/ckpt/reference"
kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true

# 2. REST and dashboard with many stored cells.
echo; echo "== $SEEDED stored cells"
"$BIN/gatehouse-controller-bench" seed --db "$WORK/b.db" --cells "$SEEDED" | tee "$WORK/seed.txt"
CELL=$(sed -n 's/.*last cell \([0-9a-f]*\).*/\1/p' "$WORK/seed.txt")
"$BIN/gatehouse-controller" --db "$WORK/b.db" tokens create --name reader --scopes read >"$WORK/read.token" 2>/dev/null
start_controller "$WORK/b.db" b
echo "| figure | value | target |"; echo "|---|---|---|"
"$BIN/gatehouse-controller-bench" get --http-port "$HTTP_PORT" --token-file "$WORK/read.token" \
  --target "/api/v1/cells/$CELL" --seconds "$SECONDS_"
"$BIN/gatehouse-controller-bench" get --http-port "$HTTP_PORT" --token-file "$WORK/read.token" \
  --target "/api/v1/cells?limit=50" --seconds "$SECONDS_"
"$BIN/gatehouse-controller-bench" dashboard --http-port "$HTTP_PORT" --token-file "$WORK/read.token"
echo "(machine: $(nproc) cores; client and controller share them)"
