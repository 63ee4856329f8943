#!/usr/bin/env bash
# Contract test of the controller's REST API against its OpenAPI document
# (controller/openapi.json) with schemathesis (pinned in deploy/requirements.txt).
#
# Starts a controller on loopback with ephemeral ports and a fresh database under --work,
# submits one real cell (a throwaway git repository and fake checkpoint/reference directories,
# like tests/controller/test_util.h MakeCheckpoint) so the cell routes answer 200/202/409 and
# not only 404, then runs schemathesis against the live controller. Fails (non-zero) when
# schemathesis reports a failure: a 5xx, a status code, content type, header or body the
# document does not allow.
#
#   tests/api/schemathesis_test.sh --controller build/bin/gatehouse-controller \
#       --python .venv/bin/python --work /tmp/gatehouse-schemathesis
#
# Options: --max-examples N (per operation, default 30), --seed N (default 1; 'random' for a
# new one), --time-limit S (schemathesis wall clock, default 150), --report FORMATS
# (schemathesis report formats written under DIR/report, default junit; har to see every
# request and response), --schema auto|live|file (where the document comes from: live is
# GET /api/v1/openapi.json of the controller under test, file is controller/openapi.json of
# this tree; auto, the default, is live when the controller serves it, else file).
# Environment: GATEHOUSE_SCHEMA_TOKEN: a bearer token sent with every request instead of the
# admin token the script issues (see AUTH SETUP below).
#
# 401 and 403 cannot occur in the schemathesis run (it sends an admin token); a few curl checks
# before it cover them (WWW-Authenticate, JSON {"error"}).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CONTROLLER=""
PYTHON=""
WORK=""
MAX_EXAMPLES=30
SEED=1
TIME_LIMIT=150
REPORTS=junit
SCHEMA_SOURCE=auto

usage() {
  echo "usage: $0 --controller BIN --python VENV_PYTHON --work DIR" \
       "[--max-examples N] [--seed N|random] [--time-limit SECONDS] [--report junit,har,...] [--schema auto|live|file]" >&2
  exit 2
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --controller) CONTROLLER="${2:?}"; shift 2 ;;
    --python) PYTHON="${2:?}"; shift 2 ;;
    --work) WORK="${2:?}"; shift 2 ;;
    --max-examples) MAX_EXAMPLES="${2:?}"; shift 2 ;;
    --seed) SEED="${2:?}"; shift 2 ;;
    --time-limit) TIME_LIMIT="${2:?}"; shift 2 ;;
    --report) REPORTS="${2:?}"; shift 2 ;;
    --schema) SCHEMA_SOURCE="${2:?}"; shift 2 ;;
    -h|--help) usage ;;
    *) echo "$0: unknown argument '$1'" >&2; usage ;;
  esac
done
[[ -n "$CONTROLLER" && -n "$PYTHON" && -n "$WORK" ]] || usage
[[ -x "$CONTROLLER" ]] || { echo "$0: controller '$CONTROLLER' is not executable" >&2; exit 2; }
[[ -x "$PYTHON" ]] || { echo "$0: python '$PYTHON' is not executable" >&2; exit 2; }
PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")"
SCHEMATHESIS="$(dirname "$PYTHON")/schemathesis"
[[ -x "$SCHEMATHESIS" ]] || {
  echo "$0: no schemathesis next to '$PYTHON' (pip install -r deploy/requirements.txt)" >&2
  exit 2
}
command -v git >/dev/null || { echo "$0: the git CLI is needed to make the seed repository" >&2; exit 2; }
command -v curl >/dev/null || { echo "$0: curl is needed" >&2; exit 2; }

CONTROLLER="$(cd "$(dirname "$CONTROLLER")" && pwd)/$(basename "$CONTROLLER")"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
# A fresh database, mirrors and seed every run.
rm -rf "$WORK/db.sqlite" "$WORK/db.sqlite-wal" "$WORK/db.sqlite-shm" "$WORK/mirrors" \
       "$WORK/seed" "$WORK/report" "$WORK/schemathesis.toml" "$WORK"/*.log
START_S=$SECONDS

CONTROLLER_PID=""
cleanup() {
  if [[ -n "$CONTROLLER_PID" ]] && kill -0 "$CONTROLLER_PID" 2>/dev/null; then
    kill -TERM "$CONTROLLER_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$CONTROLLER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$CONTROLLER_PID" 2>/dev/null || true
    wait "$CONTROLLER_PID" 2>/dev/null || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# AUTH SETUP ==================================================================================
# With a controller that has the `tokens` subcommand (auth on by default), issue into the fresh
# database, before the controller starts:
#   - an admin token, sent with every request (GATEHOUSE_SCHEMA_TOKEN, unless already set);
#   - a read-only token (READ_TOKEN, id REVOKE_TOKEN_ID): used below to check a 403, then the
#     only token DELETE /api/v1/tokens/{id} may revoke, so the run never revokes its own token.
# GATEHOUSE_SCHEMA_TOKEN set by the caller replaces the admin token (the database is new each run,
# so only a controller that accepts it, e.g. one with --auth none, makes sense with it).
# An older controller without the subcommand runs without tokens.
REVOKE_TOKEN_ID=""
READ_TOKEN=""
issue_token() {  # issue_token NAME SCOPES: prints the secret (the id is in tokens.stderr.log)
  local secret id
  secret="$("$CONTROLLER" --db "$WORK/db.sqlite" tokens create --name "$1" --scopes "$2" \
    2>"$WORK/tokens.stderr.log")"
  id="$(sed -n "s/^token \([0-9][0-9]*\) '$1'.*/\1/p" "$WORK/tokens.stderr.log")"
  [[ -n "$secret" && -n "$id" ]] || {
    echo "$0: tokens create --name $1 failed:" >&2; cat "$WORK/tokens.stderr.log" >&2; exit 2; }
  printf '%s' "$secret"
}
if "$CONTROLLER" tokens --help >/dev/null 2>&1; then
  if [[ -z "${GATEHOUSE_SCHEMA_TOKEN:-}" ]]; then
    GATEHOUSE_SCHEMA_TOKEN="$(issue_token schemathesis-admin admin)"
  fi
  READ_TOKEN="$(issue_token schemathesis-reader read)"
  REVOKE_TOKEN_ID="$(sed -n "s/^token \([0-9][0-9]*\) 'schemathesis-reader'.*/\1/p" \
    "$WORK/tokens.stderr.log")"
fi
# =============================================================================================
AUTH_HEADER=()
SCHEMATHESIS_AUTH=()
if [[ -n "${GATEHOUSE_SCHEMA_TOKEN:-}" ]]; then
  AUTH_HEADER=(-H "Authorization: Bearer $GATEHOUSE_SCHEMA_TOKEN")
  SCHEMATHESIS_AUTH=(-H "Authorization: Bearer $GATEHOUSE_SCHEMA_TOKEN")
fi

# --digest-inline-mib 0: every directory not digested yet is a 202 "resolving" first, so the
# run checks that answer against the document too.
"$CONTROLLER" --http 127.0.0.1:0 --grpc 127.0.0.1:0 --db "$WORK/db.sqlite" \
  --mirror-dir "$WORK/mirrors" --web-dir "$ROOT/web" --digest-inline-mib 0 \
  >"$WORK/controller.stdout.log" 2>"$WORK/controller.stderr.log" &
CONTROLLER_PID=$!

HOSTPORT=""
for _ in $(seq 200); do
  HOSTPORT="$(sed -n 's/^gatehouse-controller: http listening on \([^ ]*\)$/\1/p' \
    "$WORK/controller.stdout.log" | head -n1)"
  [[ -n "$HOSTPORT" ]] && break
  if ! kill -0 "$CONTROLLER_PID" 2>/dev/null; then
    echo "$0: the controller exited before listening:" >&2
    cat "$WORK/controller.stderr.log" >&2
    exit 2
  fi
  sleep 0.1
done
[[ -n "$HOSTPORT" ]] || { echo "$0: the controller did not report its http port" >&2; exit 2; }
BASE="http://$HOSTPORT"

api() {  # api METHOD PATH [BODY]: prints the body, then a line with the status code
  local args=(-sS -X "$1" "${AUTH_HEADER[@]}" -w '\n%{http_code}' "$BASE$2")
  if [[ $# -ge 3 ]]; then args+=(-H 'Content-Type: application/json' --data-binary "$3"); fi
  curl "${args[@]}"
}

# Seed one cell: a throwaway repository and fake checkpoint/reference directories.
SEED_DIR="$WORK/seed"
mkdir -p "$SEED_DIR/repo" "$SEED_DIR/ckpt" "$SEED_DIR/reference"
git -C "$SEED_DIR/repo" init -q -b main
echo "schemathesis seed" >"$SEED_DIR/repo/README"
git -C "$SEED_DIR/repo" add README
git -C "$SEED_DIR/repo" -c user.name=gatehouse -c user.email=gatehouse@localhost \
  commit -q -m seed
echo '{"model_type":"llama"}' >"$SEED_DIR/ckpt/config.json"
echo 'weights' >"$SEED_DIR/ckpt/model.safetensors"
echo '{"format":"gatehouse-reference/2"}' >"$SEED_DIR/reference/reference.json"
echo 'reference' >"$SEED_DIR/reference/reference.safetensors"
SUBMIT_BODY="$("$PYTHON" -c 'import json, sys
print(json.dumps({"repository": sys.argv[1] + "/repo", "branch": "main", "model_family": "llama",
                  "checkpoint": sys.argv[1] + "/ckpt", "phases": ["identity", "config"]}))' "$SEED_DIR")"
# A 202 answers while the controller digests the checkpoint: the same body again (60 tries).
for _ in $(seq 60); do
  SUBMIT_OUT="$(api POST /api/v1/cells "$SUBMIT_BODY")" || {
    echo "$0: seeding a cell: POST /api/v1/cells failed" >&2; exit 2; }
  SUBMIT_STATUS="${SUBMIT_OUT##*$'\n'}"
  [[ "$SUBMIT_STATUS" == "202" ]] || break
  sleep 1
done
if [[ "$SUBMIT_STATUS" != "201" ]]; then
  echo "$0: seeding a cell: POST /api/v1/cells answered $SUBMIT_STATUS:" >&2
  echo "${SUBMIT_OUT%$'\n'*}" >&2
  exit 2
fi
CELL_ID="$(printf '%s' "${SUBMIT_OUT%$'\n'*}" | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["id"])')"

# 401 and 403 never occur in the schemathesis run (it sends the admin token): check them here.
AUTH_FAILURES=0
expect_error() {  # expect_error WHAT STATUS HEADER_REGEX CURL_ARGS...: a JSON {"error"} answer
  local what="$1" want="$2" header_re="$3"; shift 3
  local status ok=1
  status="$(curl -sS -D "$WORK/auth.headers" -o "$WORK/auth.body" -w '%{http_code}' "$@" || true)"
  [[ "$status" == "$want" ]] || ok=0
  "$PYTHON" -c 'import json, sys; b = json.load(open(sys.argv[1]))
sys.exit(0 if isinstance(b, dict) and isinstance(b.get("error"), str) else 1)' \
    "$WORK/auth.body" 2>/dev/null || ok=0
  grep -qi '^Content-Type: application/json' "$WORK/auth.headers" || ok=0
  if [[ -n "$header_re" ]] && ! grep -qiE "$header_re" "$WORK/auth.headers"; then ok=0; fi
  if [[ $ok -eq 0 ]]; then
    echo "schemathesis_test: auth check failed: $what: want $want${header_re:+ and a header /$header_re/}, got $status:" >&2
    cat "$WORK/auth.headers" "$WORK/auth.body" >&2; echo >&2
    AUTH_FAILURES=$((AUTH_FAILURES + 1))
  fi
}
if [[ -n "$READ_TOKEN" ]]; then
  expect_error "GET /api/v1/cells without a token" 401 '^WWW-Authenticate: Bearer' "$BASE/api/v1/cells"
  expect_error "GET /api/v1/cells with an unknown token" 401 '^WWW-Authenticate: Bearer' \
    -H "Authorization: Bearer ghapi_$(printf '0%.0s' $(seq 64))" "$BASE/api/v1/cells"
  expect_error "POST /api/v1/cells with a read token" 403 '' -X POST \
    -H "Authorization: Bearer $READ_TOKEN" --data-binary "$SUBMIT_BODY" "$BASE/api/v1/cells"
  expect_error "POST /api/v1/cells/{id}/cancel with a read token" 403 '' -X POST \
    -H "Authorization: Bearer $READ_TOKEN" "$BASE/api/v1/cells/$CELL_ID/cancel"
  expect_error "GET /api/v1/tokens with a read token" 403 '' \
    -H "Authorization: Bearer $READ_TOKEN" "$BASE/api/v1/tokens"
  # DELETE /api/v1/tokens/{id} is pinned to the read token in the run: its 404 is checked here.
  expect_error "DELETE /api/v1/tokens/999999" 404 '' -X DELETE "${AUTH_HEADER[@]}" \
    "$BASE/api/v1/tokens/999999"
  expect_error "DELETE /api/v1/tokens/x" 404 '' -X DELETE "${AUTH_HEADER[@]}" "$BASE/api/v1/tokens/x"
fi

# The schema: from the live controller when it serves it, else from the source tree.
case "$SCHEMA_SOURCE" in auto|live|file) ;; *) echo "$0: --schema auto|live|file" >&2; exit 2 ;; esac
SCHEMA_STATUS="$(curl -sS -o "$WORK/openapi.served.json" -w '%{http_code}' "$BASE/api/v1/openapi.json" || true)"
if [[ "$SCHEMA_SOURCE" == "live" || ( "$SCHEMA_SOURCE" == "auto" && "$SCHEMA_STATUS" == "200" ) ]]; then
  SCHEMA="$BASE/api/v1/openapi.json"
  if [[ "$SCHEMA_STATUS" == "200" ]] &&
     ! "$PYTHON" -c 'import json, sys
sys.exit(json.load(open(sys.argv[1])) != json.load(open(sys.argv[2])))' \
       "$WORK/openapi.served.json" "$ROOT/controller/openapi.json" 2>/dev/null; then
    echo "schemathesis_test: note: the served document differs from controller/openapi.json" \
         "(rebuild the controller, or --schema file)"
  fi
else
  SCHEMA="$ROOT/controller/openapi.json"
  if [[ "$SCHEMA_SOURCE" == "auto" ]]; then
    echo "schemathesis_test: GET /api/v1/openapi.json answered $SCHEMA_STATUS; using $SCHEMA"
  fi
fi

# Realistic values (schemathesis dictionaries, each drawn with a probability, so random values
# are still sent too): the cell routes mostly get the seeded cell's id (a random id is only ever
# a 404); submits mostly get the seed repository, branch, family, checkpoint and reference, so
# they reach the commit resolution and cell creation (201/200) instead of stopping at a 404.
# When REVOKE_TOKEN_ID is set, DELETE /api/v1/tokens/{id} only ever revokes that token.
{
  echo '[dictionaries]'
  echo "cell_id = { values = [\"$CELL_ID\"] }"
  echo "seed_repository = { values = [\"$SEED_DIR/repo\"] }"
  echo 'seed_branch = { values = ["main"] }'
  echo 'seed_family = { values = ["llama"] }'
  echo "seed_checkpoint = { values = [\"$SEED_DIR/ckpt\"] }"
  echo "seed_reference = { values = [\"$SEED_DIR/reference\"] }"
  echo
  echo '[[operations]]'
  echo 'include-path-regex = "^/api/v1/cells/"'
  echo 'parameters = { "path.id" = { dictionary = "cell_id", probability = 0.8 } }'
  echo
  echo '[[operations]]'
  echo 'include-operation-id = "submitCell"'
  echo '[operations.parameters]'
  echo '"body.repository" = { dictionary = "seed_repository", probability = 0.9 }'
  echo '"body.branch" = { dictionary = "seed_branch", probability = 0.9 }'
  echo '"body.model_family" = { dictionary = "seed_family", probability = 0.9 }'
  echo '"body.checkpoint" = { dictionary = "seed_checkpoint", probability = 0.9 }'
  echo '"body.reference" = { dictionary = "seed_reference", probability = 0.9 }'
  if [[ -n "$REVOKE_TOKEN_ID" ]]; then
    echo
    echo '[[operations]]'
    echo 'include-operation-id = "revokeToken"'
    echo "parameters = { \"path.id\" = $REVOKE_TOKEN_ID }"
  fi
} >"$WORK/schemathesis.toml"

CHECKS="not_a_server_error,status_code_conformance,content_type_conformance"
CHECKS+=",response_schema_conformance"
HELP="$("$SCHEMATHESIS" run --help 2>&1 || true)"
for extra in response_headers_conformance unsupported_method allow_header_conformance; do
  if grep -q "$extra" <<<"$HELP"; then CHECKS+=",$extra"; fi
done
SEED_ARGS=()
if [[ "$SEED" != "random" ]]; then SEED_ARGS=(--seed "$SEED"); fi

# One worker: with two, hypothesis' lambda descriptions (ast.parse from two threads) hit
# CPython 3.11.7's "SystemError: AST constructor recursion depth mismatch"; one is fast enough.
CMD=("$SCHEMATHESIS" --config-file "$WORK/schemathesis.toml" --no-color run "$SCHEMA"
     --url "$BASE" "${SCHEMATHESIS_AUTH[@]}"
     --checks "$CHECKS" --max-examples "$MAX_EXAMPLES" "${SEED_ARGS[@]}"
     --workers 1 --request-timeout 20 --generation-database none
     --report "$REPORTS" --report-dir "$WORK/report")
echo "schemathesis_test: $("$SCHEMATHESIS" --version 2>&1 | head -n1) against $BASE" \
     "(cell $CELL_ID, $MAX_EXAMPLES examples per operation)"
set +e
(cd "$WORK" && timeout --kill-after=10 "$TIME_LIMIT" "${CMD[@]}") 2>&1 | tee "$WORK/schemathesis.log"
RC=${PIPESTATUS[0]}
set -e

ELAPSED=$((SECONDS - START_S))
if ! kill -0 "$CONTROLLER_PID" 2>/dev/null; then
  echo "schemathesis_test: the controller died during the run:" >&2
  tail -n 20 "$WORK/controller.stderr.log" >&2
  if [[ $RC -eq 0 ]]; then RC=3; fi
fi
echo
echo "schemathesis_test: summary"
echo "  controller: $BASE ($WORK/controller.stderr.log)"
echo "  schema:     $SCHEMA"
echo "  report:     $WORK/report, log $WORK/schemathesis.log"
# From schemathesis' own SUMMARY: the failure/error/warning lines, the case count and the seed.
awk '/= SUMMARY =/ { on = 1; next }
     on && /^(Failures|Errors|Warnings):/ { section = $1; next }
     on && /^Test cases:/ { getline; sub(/^ +/, ""); print "  test cases: " $0; next }
     on && /^Seed:/ { print "  seed:       " $2; next }
     on && section != "" && /^  [^ ]/ { sub(/^ +/, ""); print "  " section " " $0; next }
     on && /^$/ { section = "" }' "$WORK/schemathesis.log" || true
if [[ -n "$READ_TOKEN" ]]; then
  echo "  auth checks (401 without/with an unknown token, 403 without the scope, revoke 404): $AUTH_FAILURES failed"
fi
if [[ $AUTH_FAILURES -ne 0 ]]; then
  echo "schemathesis_test: FAIL ($AUTH_FAILURES auth checks failed; schemathesis exit $RC; ${ELAPSED}s in all)"
  exit 1
elif [[ $RC -eq 124 || $RC -eq 137 ]]; then
  echo "schemathesis_test: FAIL (schemathesis ran past ${TIME_LIMIT}s; ${ELAPSED}s in all)"
  exit 1
elif [[ $RC -ne 0 ]]; then
  echo "schemathesis_test: FAIL (schemathesis exit $RC; ${ELAPSED}s in all)"
  exit 1
fi
echo "schemathesis_test: PASS (${ELAPSED}s in all)"
