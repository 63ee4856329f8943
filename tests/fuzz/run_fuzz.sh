#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (a standalone clang project; the main gcc build is
# unaffected) and runs each for a bounded time from its committed seed corpus. Fails on any
# crash, leak, undefined behaviour, timeout or out-of-memory and prints the saved input.
#
#   tests/fuzz/run_fuzz.sh [options] [TARGET...] [-- libFuzzer flags...]
#     TARGET          fuzz_safetensors_header, fuzz_cell_spec (default: both)
#     --seconds N     fuzzing time per target (default $GATEHOUSE_FUZZ_SECONDS or 30)
#     --build-dir D   build directory (default $GATEHOUSE_FUZZ_BUILD_DIR or <repo>/build/fuzz)
#     --build-only    configure and build, do not fuzz (ctest's fuzz_build fixture)
#     --no-build      fuzz what is built (ctest's fuzz tests, after fuzz_build)
#     --keep          keep the run directory (the grown corpus) even when nothing was found
# Environment: GATEHOUSE_FUZZ_JOBS (build jobs, default: number of cores), GATEHOUSE_FUZZ_CC /
# GATEHOUSE_FUZZ_CXX (default clang / clang++; CC and CXX are left to the main build),
# CCACHE_* as in deploy/setup.sh.
#
# The committed corpus is never written: libFuzzer writes new inputs only into the first
# corpus directory, which is a fresh one under the run directory; the committed one is read
# as the second. Run longer locally, e.g.: tests/fuzz/run_fuzz.sh --seconds 3600 --keep
# fuzz_cell_spec -- -jobs=2 -workers=2
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
ALL_TARGETS=(fuzz_safetensors_header fuzz_cell_spec)

SECONDS_EACH=${GATEHOUSE_FUZZ_SECONDS:-30}
BUILD_DIR=${GATEHOUSE_FUZZ_BUILD_DIR:-$ROOT/build/fuzz}
JOBS=${GATEHOUSE_FUZZ_JOBS:-$(nproc)}
DO_BUILD=1
DO_RUN=1
KEEP=0
TARGETS=()
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_EACH=$2; shift 2 ;;
    --build-dir) BUILD_DIR=$2; shift 2 ;;
    --build-only) DO_RUN=0; shift ;;
    --no-build) DO_BUILD=0; shift ;;
    --keep) KEEP=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,20p' "${BASH_SOURCE[0]}"; exit 0 ;;
    fuzz_*) TARGETS+=("$1"); shift ;;
    *) echo "run_fuzz.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=("${ALL_TARGETS[@]}")
log() { printf '[fuzz] %s\n' "$*"; }
die() { printf '[fuzz] ERROR: %s\n' "$*" >&2; exit 1; }

if [ "$DO_BUILD" = 1 ]; then
  CC=${GATEHOUSE_FUZZ_CC:-clang}
  CXX=${GATEHOUSE_FUZZ_CXX:-clang++}
  command -v "$CXX" >/dev/null 2>&1 ||
    die "'$CXX' not found. The fuzz tests need clang with libFuzzer (Debian 12: apt-get install clang libclang-rt-14-dev; deploy/setup.sh installs both)."
  "$CXX" --version 2>/dev/null | grep -qi clang ||
    die "'$CXX' is not clang; libFuzzer needs clang (set GATEHOUSE_FUZZ_CXX=clang++)."
  probe=$(mktemp -d)
  trap 'rm -rf "$probe"' EXIT
  printf '#include <cstdint>\n#include <cstddef>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' >"$probe/p.cc"
  "$CXX" -fsanitize=fuzzer,address,undefined "$probe/p.cc" -o "$probe/p" >"$probe/log" 2>&1 ||
    die "'$CXX' cannot link -fsanitize=fuzzer,address,undefined: the libFuzzer runtime (libclang_rt.fuzzer) is missing (Debian 12: apt-get install libclang-rt-14-dev; deploy/setup.sh installs it). Compiler said: $(head -c 600 "$probe/log")"

  export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}
  export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
  generator=()
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then
    generator=(-G Ninja)
  fi
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    log "configuring $BUILD_DIR with $CXX"
    mkdir -p "$BUILD_DIR"
    CC=$CC CXX=$CXX cmake -S "$HERE" -B "$BUILD_DIR" "${generator[@]}" >"$BUILD_DIR/configure.log" 2>&1 ||
      { cat "$BUILD_DIR/configure.log" >&2; die "configuring the fuzz project failed"; }
  fi
  log "building ${TARGETS[*]} in $BUILD_DIR (-j$JOBS)"
  cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]}"
fi
[ "$DO_RUN" = 1 ] || exit 0

export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
failed=0
for target in "${TARGETS[@]}"; do
  exe="$BUILD_DIR/$target"
  name=${target#fuzz_}
  seeds="$HERE/corpus/$name"
  [ -x "$exe" ] || die "$exe is not built (run tests/fuzz/run_fuzz.sh --build-only, or ctest's fuzz_build)"
  [ -d "$seeds" ] || die "no seed corpus $seeds"
  mkdir -p "$BUILD_DIR/runs"
  work=$(mktemp -d "$BUILD_DIR/runs/$target.XXXXXX")
  mkdir -p "$work/corpus" "$work/artifacts"
  dict=()
  [ -f "$HERE/$name.dict" ] && dict=(-dict="$HERE/$name.dict")
  log "$target: fuzzing for ${SECONDS_EACH}s from $seeds ($(ls "$seeds" | wc -l) seeds); log $work/fuzz.log"
  start=$(date +%s)
  rc=0
  "$exe" -max_total_time="$SECONDS_EACH" -timeout=5 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/" "${dict[@]}" "${EXTRA[@]}" "$work/corpus" "$seeds" \
    >"$work/fuzz.log" 2>&1 || rc=$?
  elapsed=$(( $(date +%s) - start ))
  # The last status line (#runs, cov, ft, corpus, exec/s) and the final stats.
  grep -E '^#[0-9]+' "$work/fuzz.log" | tail -1 || true
  grep -E '^stat::' "$work/fuzz.log" || true
  mapfile -t artifacts < <(find "$work/artifacts" -type f | sort)
  if [ "$rc" -ne 0 ] || [ ${#artifacts[@]} -gt 0 ]; then
    failed=1
    echo "----- last 80 lines of $work/fuzz.log -----"
    tail -n 80 "$work/fuzz.log"
    echo "-------------------------------------------"
    log "$target FAILED after ${elapsed}s (libFuzzer exit code $rc)."
    for a in "${artifacts[@]}"; do
      log "  input: $a"
      log "  reproduce: $exe $a"
    done
    [ ${#artifacts[@]} -gt 0 ] || log "  (no input saved; see the log above)"
    log "  Once fixed, add the input to $seeds and a regression unit test."
  else
    log "$target: no crash, leak or UB in ${elapsed}s"
    if [ "$KEEP" = 1 ]; then
      log "  grown corpus kept in $work/corpus"
    else
      rm -rf "$work"
    fi
  fi
done
exit "$failed"
