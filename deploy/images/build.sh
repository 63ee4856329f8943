#!/usr/bin/env bash
# Builds Gatehouse's container images from Debian packages with Debian's own tools (debootstrap,
# buildah): no base image is pulled from a registry. docs/deploy.md "Container images".
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: deploy/images/build.sh [OPTIONS]

Builds the gatehouse-controller image (and, with --agent, the gatehouse-agent image) from a
debootstrap'd Debian 12 minbase root (cached) and the binaries of a build tree. Run as root
(debootstrap and chroot need it). Images go to buildah's local storage, tagged
<name>:<version> and <name>:latest (deploy/k8s/kustomization.yaml names these).

Layers (each image's, bottom to top):
  gatehouse-base      Debian 12 minbase with bookworm-updates/-security applied, docs and apt
                      lists dropped, users gatehouse (999) and gatehouse-agent (998)
  controller:
    runtime           the Debian packages owning the controller's shared libraries (found with
                      ldd + dpkg -S on the built binary) + ca-certificates
    gatehouse         /opt/gatehouse/bin/gatehouse-controller (debug info stripped), /opt/gatehouse/web
  agent (--agent):
    toolchain         g++, cmake, ninja, ccache, git, python3.11, the SDK's headers and the agent's
                      and worker's runtime packages (ldd + dpkg -S again)
    runtime-torch     the CUDA toolkit (--cuda-dir) and the venv (torch) at /opt/gatehouse/.venv
    gatehouse         the source tree and build outputs at /opt/gatehouse (the checkout layout the
                      DaemonSet's args name), paths relocated from the build tree

Options:
  --agent               also build gatehouse-agent (large: LibTorch, CUDA; opt-in)
  --no-controller       do not build gatehouse-controller (with --agent: the agent alone)
  --build-dir DIR       build tree with bin/ (default: $GATEHOUSE_BUILD_DIR or <repo>/build)
  --venv DIR            the venv copied into the agent (default: $GATEHOUSE_VENV or <repo>/.venv)
  --cuda-dir DIR        CUDA toolkit copied into the agent at the same path (default: the
                        target of /usr/local/cuda; find_package(Torch) needs nvcc and headers)
  --cache-dir DIR       debootstrap root and apt caches, reused between runs (default:
                        ${XDG_CACHE_HOME:-$HOME/.cache}/gatehouse-images)
  --refresh             debootstrap the cached root again
  --mirror URL          Debian mirror (default http://deb.debian.org/debian)
  --security-mirror URL (default http://deb.debian.org/debian-security)
  --version V           image tag (default: git describe --always --dirty of the checkout)
  --source URL          org.opencontainers.image.source (default: git remote origin, if any)
  --no-strip            keep the binaries' debug info
  --root DIR            container storage root (buildah --root; default: buildah's)
  --runroot DIR         container state directory (buildah --runroot)
  --storage-driver D    storage driver (default vfs: works inside containers and anywhere)
  -h, --help            this text

Examples:
  deploy/images/build.sh                  # gatehouse-controller:<version> and :latest
  deploy/images/build.sh --agent          # and gatehouse-agent (about 9 GB)
  podman push gatehouse-controller:latest registry.example/gatehouse-controller:latest
EOF
}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD_DIR=${GATEHOUSE_BUILD_DIR:-$ROOT/build}
VENV=${GATEHOUSE_VENV:-$ROOT/.venv}
CUDA_DIR=""
CACHE_DIR=${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/gatehouse-images
MIRROR=http://deb.debian.org/debian
SECURITY_MIRROR=http://deb.debian.org/debian-security
SUITE=bookworm   # the binaries are built on Debian 12: their libraries' sonames are bookworm's
VERSION=""
SOURCE=""
STRIP=1
CONTROLLER=1
AGENT=0
REFRESH=0
DRIVER=vfs
STORAGE=()

while [ $# -gt 0 ]; do
  case "$1" in
    --agent) AGENT=1 ;;
    --no-controller) CONTROLLER=0 ;;
    --build-dir) BUILD_DIR=$2; shift ;;
    --venv) VENV=$2; shift ;;
    --cuda-dir) CUDA_DIR=$2; shift ;;
    --cache-dir) CACHE_DIR=$2; shift ;;
    --refresh) REFRESH=1 ;;
    --mirror) MIRROR=$2; shift ;;
    --security-mirror) SECURITY_MIRROR=$2; shift ;;
    --version) VERSION=$2; shift ;;
    --source) SOURCE=$2; shift ;;
    --no-strip) STRIP=0 ;;
    --root) STORAGE+=(--root "$2"); shift ;;
    --runroot) STORAGE+=(--runroot "$2"); shift ;;
    --storage-driver) DRIVER=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build.sh: unknown argument '$1' (--help lists the options)" >&2; exit 2 ;;
  esac
  shift
done

log() { printf '[images] %s\n' "$*" >&2; }
die() { printf '[images] error: %s\n' "$*" >&2; exit 1; }

[ "$CONTROLLER" = 1 ] || [ "$AGENT" = 1 ] || die "nothing to build (--no-controller without --agent)"
[ "$(id -u)" -eq 0 ] || die "run as root: debootstrap and chroot need it"
for tool in debootstrap buildah chroot mount umount flock ldd dpkg strip; do
  command -v "$tool" >/dev/null || die "$tool not found (deploy/setup.sh installs debootstrap and buildah)"
done
BUILD_DIR=$(cd "$BUILD_DIR" && pwd) || die "no build tree $BUILD_DIR"
BIN=$BUILD_DIR/bin
[ "$CONTROLLER" = 0 ] || [ -x "$BIN/gatehouse-controller" ] || die "$BIN/gatehouse-controller is not built (deploy/setup.sh)"
if [ "$AGENT" = 1 ]; then
  for b in gatehouse-agent gatehouse-slurm-rank gatehouse-worker; do
    [ -x "$BIN/$b" ] || die "$BIN/$b is not built (deploy/setup.sh)"
  done
  [ -f "$BUILD_DIR/sdk/GatehouseWorkerConfig.cmake" ] || die "no worker SDK in $BUILD_DIR/sdk"
  [ -x "$VENV/bin/python" ] || die "no venv at $VENV (deploy/setup.sh makes it)"
  VENV=$(cd "$VENV" && pwd)
  if [ -z "$CUDA_DIR" ] && [ -e /usr/local/cuda ]; then CUDA_DIR=$(readlink -f /usr/local/cuda); fi
  if [ -z "$CUDA_DIR" ] || [ ! -x "$CUDA_DIR/bin/nvcc" ]; then die "no CUDA toolkit (--cuda-dir DIR with bin/nvcc)"; fi
  command -v patchelf >/dev/null || die "patchelf not found (apt-get install patchelf): the agent's binaries are relocated"
fi

if [ -z "$VERSION" ]; then
  VERSION=$(git -C "$ROOT" describe --tags --always --dirty 2>/dev/null || echo unknown)
fi
REVISION=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
[ -n "$SOURCE" ] || SOURCE=$(git -C "$ROOT" remote get-url origin 2>/dev/null || true)
CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)
B=(buildah --storage-driver "$DRIVER" "${STORAGE[@]}")

# ---------------------------------------------------------------------------------------------
# Cleanup: every mount made in a chroot, every working container, on any exit.
MOUNTS=()
CONTAINERS=()
cleanup() {
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    umount "${MOUNTS[$i]}" 2>/dev/null || umount -l "${MOUNTS[$i]}" 2>/dev/null || true
  done
  MOUNTS=()
  for c in "${CONTAINERS[@]}"; do "${B[@]}" rm "$c" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$CACHE_DIR"
CACHE_DIR=$(cd "$CACHE_DIR" && pwd)
exec 9>"$CACHE_DIR/.lock"
flock -w 900 9 || die "another build holds $CACHE_DIR/.lock"
mkdir -p "$CACHE_DIR/apt-archives/partial" "$CACHE_DIR/apt-lists/partial"
APT_LOG=$CACHE_DIR/apt.log
: > "$APT_LOG"

# 1. The debootstrap root, made once (atomically: a killed run leaves no half root behind).
MINBASE=$CACHE_DIR/$SUITE-minbase
if [ "$REFRESH" = 1 ] || [ ! -f "$MINBASE/.gatehouse-debootstrap-ok" ]; then
  log "debootstrap --variant=minbase $SUITE ($MIRROR) into $MINBASE"
  rm -rf "$MINBASE.tmp" "$MINBASE"
  start=$SECONDS
  debootstrap --variant=minbase --cache-dir="$CACHE_DIR/apt-archives" "$SUITE" "$MINBASE.tmp" "$MIRROR" \
    > "$CACHE_DIR/debootstrap.log" 2>&1 || { tail -20 "$CACHE_DIR/debootstrap.log" >&2; die "debootstrap failed"; }
  touch "$MINBASE.tmp/.gatehouse-debootstrap-ok"
  mv "$MINBASE.tmp" "$MINBASE"
  log "debootstrap done in $((SECONDS - start)) s"
else
  log "reusing $MINBASE (--refresh makes it again)"
fi

# ---------------------------------------------------------------------------------------------
# Helpers.

# new_container FROM -> sets CTR and MNT (a working container and its mounted root).
new_container() {
  CTR=$("${B[@]}" from --pull=never --quiet "$1")
  CONTAINERS+=("$CTR")
  MNT=$("${B[@]}" mount "$CTR")
}

# in_root CMD...: CMD chrooted in $MNT with /proc, /dev and the cached apt lists and archives
# mounted (so repeated builds download only what changed), unmounted again afterwards.
in_root() {
  local n=${#MOUNTS[@]} rc=0
  mount -t proc proc "$MNT/proc"; MOUNTS+=("$MNT/proc")
  mount --bind /dev "$MNT/dev"; MOUNTS+=("$MNT/dev")
  if [ -d /dev/pts ]; then mount --bind /dev/pts "$MNT/dev/pts"; MOUNTS+=("$MNT/dev/pts"); fi
  mkdir -p "$MNT/var/cache/apt/archives" "$MNT/var/lib/apt/lists"
  mount --bind "$CACHE_DIR/apt-archives" "$MNT/var/cache/apt/archives"; MOUNTS+=("$MNT/var/cache/apt/archives")
  mount --bind "$CACHE_DIR/apt-lists" "$MNT/var/lib/apt/lists"; MOUNTS+=("$MNT/var/lib/apt/lists")
  cp /etc/resolv.conf "$MNT/etc/resolv.conf"
  printf '#!/bin/sh\nexit 101\n' > "$MNT/usr/sbin/policy-rc.d"; chmod 755 "$MNT/usr/sbin/policy-rc.d"
  chroot "$MNT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive "$@" || rc=$?
  rm -f "$MNT/usr/sbin/policy-rc.d"
  : > "$MNT/etc/resolv.conf"
  while [ ${#MOUNTS[@]} -gt "$n" ]; do
    umount "${MOUNTS[-1]}"
    unset 'MOUNTS[-1]'
  done
  return $rc
}

# apt's and dpkg's chatter goes to $CACHE_DIR/apt.log, shown when a step fails.
apt_step() {  # apt_step SHELL-SCRIPT [ARGS...]: the script run by sh in the root
  local script=$1; shift
  in_root sh -c "$script" sh "$@" >>"$APT_LOG" 2>&1 || { tail -30 "$APT_LOG" >&2; die "apt in the image failed (log: $APT_LOG)"; }
}
apt_install() {
  apt_step 'apt-get update -q && apt-get install -y -q "$@"' "$@"
}

# Removes what a runtime image needs no copy of: package docs (copyright files stay), logs,
# apt's state caches, backup files. apt lists and .debs never land in the image (in_root).
slim_root() {
  find "$MNT/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete 2>/dev/null || true
  find "$MNT/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
  rm -rf "$MNT"/usr/share/man/* "$MNT"/usr/share/info/* "$MNT"/usr/share/lintian \
    "$MNT"/var/cache/apt/*.bin "$MNT"/var/cache/debconf/*-old "$MNT"/var/lib/dpkg/*-old \
    "$MNT"/var/log/apt/* "$MNT"/var/log/dpkg.log "$MNT"/var/log/alternatives.log \
    "$MNT"/var/log/bootstrap.log "$MNT"/tmp/* "$MNT"/root/.cache
  find "$MNT/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} + 2>/dev/null || true
}

# runtime_packages BINARY...: the Debian packages owning the shared libraries the binaries load
# (ldd on this machine, dpkg -S). Libraries under a path in $SKIP_LIBS_UNDER (the venv, the build
# tree) come with the image's own layers; any other library no package owns is an error.
SKIP_LIBS_UNDER=()
runtime_packages() {
  local lib real pkgs skip p out
  out=$(LC_ALL=C ldd "$@" 2>&1) || die "ldd $*: $out"
  if grep -q 'not found\|not a dynamic' <<<"$out"; then
    grep 'not found\|not a dynamic' <<<"$out" >&2
    die "ldd $*: unresolved libraries (or a binary being rebuilt)"
  fi
  while read -r lib; do
    real=$(readlink -f "$lib")
    skip=0
    for p in "${SKIP_LIBS_UNDER[@]}"; do
      case "$real" in "$p"/*) skip=1 ;; esac
    done
    [ "$skip" = 0 ] || continue
    pkgs=$( (dpkg -S "$lib" || dpkg -S "$real" || dpkg -S "/usr$lib" || dpkg -S "${real#/usr}") 2>/dev/null | head -1) ||
      die "$lib ($real) belongs to no Debian package"
    printf '%s\n' "${pkgs%%: *}" | tr ',' '\n'
  done < <(awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' <<<"$out" | sort -u) |
    sed 's/^ *//; s/:[a-z0-9]*$//' | sort -u
}

# check_libs FILE...: every shared library each file needs resolves inside the image.
check_libs() {
  local f out
  for f in "$@"; do
    out=$(chroot "$MNT" /usr/bin/ldd "$f" 2>&1) || die "ldd $f in the image: $out"
    if grep -q 'not found' <<<"$out"; then
      grep 'not found' <<<"$out" >&2
      die "$f: libraries missing in the image"
    fi
  done
}

commit() {  # commit NAME...: the working container as image NAME (first) with the other tags
  local name=$1; shift
  "${B[@]}" unmount "$CTR" >/dev/null
  "${B[@]}" commit --quiet --rm "$CTR" "$name" >/dev/null
  CONTAINERS=("${CONTAINERS[@]/$CTR/}")
  for t in "$@"; do "${B[@]}" tag "$name" "$t"; done
}

image_size() {  # the image's size (all its layers, uncompressed) as buildah shows it
  "${B[@]}" images --noheading --format '{{.Size}}' "$1" | head -1
}

label_args() {  # label_args TITLE DESCRIPTION
  local a=(--label "org.opencontainers.image.title=$1" --label "org.opencontainers.image.description=$2"
    --label "org.opencontainers.image.version=$VERSION" --label "org.opencontainers.image.revision=$REVISION"
    --label "org.opencontainers.image.created=$CREATED" --label "org.opencontainers.image.vendor=Gatehouse"
    --label "org.opencontainers.image.base.name=debian:$SUITE (debootstrap --variant=minbase)")
  [ -z "$SOURCE" ] || a+=(--label "org.opencontainers.image.source=$SOURCE")
  printf '%s\0' "${a[@]}"
}

# ---------------------------------------------------------------------------------------------
# 2. gatehouse-base: the minbase root, updated and slimmed, with the two service users.
BASE=localhost/gatehouse-base:$SUITE
log "layer gatehouse-base: minbase root + $SUITE-updates/-security, users 999/998"
start=$SECONDS
CTR=$("${B[@]}" from scratch); CONTAINERS+=("$CTR"); MNT=$("${B[@]}" mount "$CTR")
tar -C "$MINBASE" --exclude=./.gatehouse-debootstrap-ok --exclude=./var/cache/apt/archives \
  --exclude=./var/lib/apt/lists --exclude=./dev --exclude=./proc --exclude=./sys -cf - . | tar -C "$MNT" -xpf -
mkdir -p "$MNT/dev" "$MNT/proc" "$MNT/sys" "$MNT/var/cache/apt/archives/partial" "$MNT/var/lib/apt/lists/partial"
chmod 755 "$MNT/dev" "$MNT/proc" "$MNT/sys"
rm -f "$MNT/etc/apt/sources.list" "$MNT/etc/hostname"
cat > "$MNT/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY_MIRROR
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
# Later layers' packages come without docs, man pages or translations, and no recommends.
cat > "$MNT/etc/dpkg/dpkg.cfg.d/gatehouse-slim" <<'EOF'
# Gatehouse images (deploy/images/build.sh): no docs beyond copyright files, no man pages or translations
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
EOF
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' > "$MNT/etc/apt/apt.conf.d/90gatehouse"
apt_step 'set -e; apt-get update -q && apt-get upgrade -y -q
  groupadd --system --gid 999 gatehouse
  useradd --system --uid 999 --gid 999 --no-create-home --home-dir /var/lib/gatehouse \
    --shell /usr/sbin/nologin --comment "Gatehouse controller" gatehouse
  groupadd --system --gid 998 gatehouse-agent
  useradd --system --uid 998 --gid 998 --no-create-home --home-dir /var/lib/gatehouse-agent \
    --shell /usr/sbin/nologin --comment "Gatehouse agent" gatehouse-agent'
slim_root
"${B[@]}" config --created-by "deploy/images/build.sh: Debian $SUITE minbase" \
  --env LANG=C.UTF-8 --label "org.opencontainers.image.base.name=debian:$SUITE (debootstrap --variant=minbase)" "$CTR"
commit "$BASE"
log "gatehouse-base: $(image_size "$BASE") ($((SECONDS - start)) s)"

# ---------------------------------------------------------------------------------------------
# 3. gatehouse-controller.
if [ "$CONTROLLER" = 1 ]; then
  IMAGE=localhost/gatehouse-controller
  start=$SECONDS
  PKGS_TEXT=$(runtime_packages "$BIN/gatehouse-controller")
  mapfile -t PKGS <<<"$PKGS_TEXT"
  log "layer controller runtime: ${PKGS[*]} ca-certificates"
  new_container "$BASE"
  apt_install "${PKGS[@]}" ca-certificates
  slim_root
  "${B[@]}" config --created-by "deploy/images/build.sh: controller runtime packages" "$CTR"
  commit "$IMAGE-runtime:$VERSION"

  log "layer controller gatehouse: /opt/gatehouse/bin/gatehouse-controller, /opt/gatehouse/web"
  new_container "$IMAGE-runtime:$VERSION"
  install -d -m 755 "$MNT/opt/gatehouse/bin" "$MNT/opt/gatehouse/build"
  if [ "$STRIP" = 1 ]; then
    strip --strip-debug -o "$MNT/opt/gatehouse/bin/gatehouse-controller" "$BIN/gatehouse-controller"
  else
    cp "$BIN/gatehouse-controller" "$MNT/opt/gatehouse/bin/"
  fi
  chmod 755 "$MNT/opt/gatehouse/bin/gatehouse-controller"
  ln -s ../bin "$MNT/opt/gatehouse/build/bin"   # the path of a checkout's build (deploy/systemd)
  # The dashboard is served from --web-dir at run time (only the migrations and openapi.json
  # are compiled in).
  cp -r "$ROOT/web" "$MNT/opt/gatehouse/web"
  chmod -R u=rwX,go=rX "$MNT/opt/gatehouse"
  # State (the StatefulSet mounts its volume claim here) and a writable /tmp.
  install -d -m 700 -o 999 -g 999 "$MNT/var/lib/gatehouse"
  check_libs /opt/gatehouse/bin/gatehouse-controller
  mapfile -d '' -t LABELS < <(label_args gatehouse-controller \
    "Gatehouse controller: REST API, dashboard, agents' gRPC service, SQLite store")
  "${B[@]}" config --created-by "deploy/images/build.sh: gatehouse-controller" \
    --user 999:999 --workingdir /var/lib/gatehouse \
    --entrypoint '["/opt/gatehouse/bin/gatehouse-controller"]' \
    --cmd '["--db=/var/lib/gatehouse/gatehouse.db", "--artifact-dir=/var/lib/gatehouse/artifacts", "--mirror-dir=/var/lib/gatehouse/mirrors", "--web-dir=/opt/gatehouse/web", "--http=0.0.0.0:8080", "--grpc=0.0.0.0:50051"]' \
    --port 8080/tcp --port 50051/tcp --stop-signal SIGTERM --env HOME=/var/lib/gatehouse \
    "${LABELS[@]}" "$CTR"
  commit "$IMAGE:$VERSION" "$IMAGE:latest"
  log "gatehouse-controller:$VERSION: $(image_size "$IMAGE:$VERSION") ($((SECONDS - start)) s)"
fi

# ---------------------------------------------------------------------------------------------
# 4. gatehouse-agent (opt-in): the checkout layout of deploy/k8s/agent.yaml's args.
if [ "$AGENT" = 1 ]; then
  IMAGE=localhost/gatehouse-agent
  start=$SECONDS
  OPT=/opt/gatehouse
  SKIP_LIBS_UNDER=("$VENV" "$BUILD_DIR" "$CUDA_DIR")
  PKGS_TEXT=$(runtime_packages "$BIN/gatehouse-agent" "$BIN/gatehouse-worker")
  mapfile -t PKGS <<<"$PKGS_TEXT"
  # The recipe build (docs/protocols.md §5: CMake, Ninja, ccache, the SDK's find_dependency of
  # nlohmann_json and OpenSSL), git, the venv's interpreter and the worker's embedded Python.
  TOOLCHAIN=(g++ make cmake ninja-build ccache git pkg-config nlohmann-json3-dev libssl-dev
    python3.11 libpython3.11 python3.11-dev ca-certificates)
  log "layer agent toolchain: ${TOOLCHAIN[*]} ${PKGS[*]}"
  new_container "$BASE"
  apt_install "${TOOLCHAIN[@]}" "${PKGS[@]}"
  slim_root
  "${B[@]}" config --created-by "deploy/images/build.sh: agent toolchain and runtime packages" "$CTR"
  commit "$IMAGE-toolchain:$VERSION"

  log "layer agent runtime-torch: $CUDA_DIR, the venv ($VENV) at $OPT/.venv"
  new_container "$IMAGE-toolchain:$VERSION"
  mkdir -p "$MNT$CUDA_DIR"
  cp -a "$CUDA_DIR/." "$MNT$CUDA_DIR/"
  [ "$CUDA_DIR" = /usr/local/cuda ] || ln -sfn "$CUDA_DIR" "$MNT/usr/local/cuda"
  # A venv of Debian's python3.11 holding the build's site-packages (torch and the rest); its
  # scripts' shebangs name the image's path.
  chroot "$MNT" /usr/bin/python3.11 -m venv --without-pip "$OPT/.venv"
  [ -d "$VENV/lib/python3.11/site-packages" ] || die "$VENV is no python3.11 venv; the image has Debian 12's python3.11"
  cp -a "$VENV/lib/python3.11/site-packages/." "$MNT$OPT/.venv/lib/python3.11/site-packages/"
  for f in "$VENV"/bin/*; do
    n=$(basename "$f")
    [ -e "$MNT$OPT/.venv/bin/$n" ] && continue
    if [ ! -f "$f" ] || [ -L "$f" ]; then continue; fi
    if head -c 2 "$f" | grep -q '^#!'; then
      sed "1s|^#!.*python.*$|#!$OPT/.venv/bin/python|" "$f" > "$MNT$OPT/.venv/bin/$n"
      chmod 755 "$MNT$OPT/.venv/bin/$n"
    else
      cp -a "$f" "$MNT$OPT/.venv/bin/"
    fi
  done
  find "$MNT$OPT/.venv" -name __pycache__ -type d -prune -exec rm -rf {} +
  in_root "$OPT/.venv/bin/python" -c 'import torch; print("[images] torch", torch.__version__, "imports in the image")' >&2 ||
    die "torch does not import in the image's venv"
  "${B[@]}" config --created-by "deploy/images/build.sh: CUDA toolkit and venv" "$CTR"
  commit "$IMAGE-torch:$VERSION"

  log "layer agent gatehouse: the tree and its build at $OPT"
  new_container "$IMAGE-torch:$VERSION"
  # The sources the SDK's headers come from (tracked and untracked, not ignored files).
  (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do if [ -e "$f" ]; then printf '%s\0' "$f"; fi; done |
    tar --null --no-recursion -T - -cf -) | tar -C "$MNT$OPT" -xpf -
  mkdir -p "$MNT$OPT/build/bin" "$MNT$OPT/build/common" "$MNT$OPT/build/worker_lib"
  for b in gatehouse-agent gatehouse-slurm-rank gatehouse-worker gatehouse; do
    [ -x "$BIN/$b" ] || continue
    if [ "$STRIP" = 1 ]; then strip --strip-debug -o "$MNT$OPT/build/bin/$b" "$BIN/$b"; else cp "$BIN/$b" "$MNT$OPT/build/bin/"; fi
  done
  cp -a "$BUILD_DIR/sdk" "$MNT$OPT/build/"
  cp "$BUILD_DIR/common/libgatehouse_common.a" "$MNT$OPT/build/common/"
  if [ "$STRIP" = 1 ]; then
    strip --strip-debug -o "$MNT$OPT/build/worker_lib/libgatehouse_worker_sdk.so" "$BUILD_DIR/worker_lib/libgatehouse_worker_sdk.so"
  else
    cp "$BUILD_DIR/worker_lib/libgatehouse_worker_sdk.so" "$MNT$OPT/build/worker_lib/"
  fi
  # Relocate: the build tree's absolute paths (SDK config, run paths) to the image's.
  sed -i "s|$BUILD_DIR|$OPT/build|g; s|$VENV|$OPT/.venv|g; s|$ROOT|$OPT|g" "$MNT$OPT"/build/sdk/*.cmake
  for f in "$MNT$OPT/build/bin/gatehouse-worker" "$MNT$OPT/build/worker_lib/libgatehouse_worker_sdk.so"; do
    rp=$(patchelf --print-rpath "$f")
    patchelf --set-rpath "$(sed "s|$BUILD_DIR|$OPT/build|g; s|$VENV|$OPT/.venv|g" <<<"$rp")" "$f"
  done
  ln -s build/bin "$MNT$OPT/bin"
  chmod -R u=rwX,go=rX "$MNT$OPT/build"
  if grep -rlI --exclude-dir=.venv "$ROOT" "$MNT$OPT/build/sdk" >/dev/null 2>&1; then die "build paths left in the SDK"; fi
  check_libs "$OPT/build/bin/gatehouse-agent" "$OPT/build/bin/gatehouse-worker"
  # What a recipe build does (docs/protocols.md §5), on a one-file plugin: find_package of the
  # SDK (Torch, CUDA's nvcc, nlohmann_json, OpenSSL), configure with Ninja, build, link.
  mkdir -p "$MNT/tmp/gh-check"
  printf 'cmake_minimum_required(VERSION 3.22)\nproject(gh_check CXX)\nfind_package(GatehouseWorker CONFIG REQUIRED)\ngatehouse_add_model_plugin(gh_check SOURCES check.cc)\n' \
    > "$MNT/tmp/gh-check/CMakeLists.txt"
  echo 'int gatehouse_image_check() { return 0; }' > "$MNT/tmp/gh-check/check.cc"
  in_root env PATH="$OPT/.venv/bin:/usr/local/cuda/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    CUDA_HOME=/usr/local/cuda LIBRARY_PATH=/usr/local/cuda/lib64/stubs sh -c "
      cmake -S /tmp/gh-check -B /tmp/gh-check/build -G Ninja -DCMAKE_PREFIX_PATH='$OPT/build/sdk;$OPT/.venv/lib/python3.11/site-packages/torch/share/cmake' \
        -DGatehouseWorker_DIR=$OPT/build/sdk -DTORCH_CUDA_ARCH_LIST=9.0 -DGATEHOUSE_PLUGIN_PCH=OFF &&
      cmake --build /tmp/gh-check/build" > "$CACHE_DIR/agent-check.log" 2>&1 ||
    { tail -30 "$CACHE_DIR/agent-check.log" >&2; die "a plugin does not build in the agent image (log: $CACHE_DIR/agent-check.log)"; }
  rm -rf "$MNT/tmp/gh-check" "$MNT/root/.cache"
  log "a one-file plugin configures and builds against $OPT/build/sdk in the image"
  install -d -m 700 -o 998 -g 998 "$MNT/var/lib/gatehouse-agent" "$MNT/var/cache/gatehouse-agent"
  mapfile -d '' -t LABELS < <(label_args gatehouse-agent \
    "Gatehouse agent: checks out and builds adaptations, runs the worker per rank (LibTorch, CUDA)")
  "${B[@]}" config --created-by "deploy/images/build.sh: gatehouse-agent" \
    --user 998:998 --workingdir /var/lib/gatehouse-agent \
    --entrypoint "[\"$OPT/build/bin/gatehouse-agent\"]" \
    --cmd "[\"--work-dir=/var/lib/gatehouse-agent\", \"--sdk-dir=$OPT/build/sdk\", \"--cmake-prefix-path=$OPT/.venv/lib/python3.11/site-packages/torch/share/cmake\", \"--worker=$OPT/build/bin/gatehouse-worker\", \"--python=$OPT/.venv/bin/python\", \"--reference-python=$OPT/.venv/bin/python\", \"--reference-script=$OPT/tools/refgen/reference_cell.py\"]" \
    --env HOME=/var/lib/gatehouse-agent --env CCACHE_DIR=/var/cache/gatehouse-agent/ccache \
    --env PIP_CACHE_DIR=/var/cache/gatehouse-agent/pip \
    --env "PATH=$OPT/.venv/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --env CUDA_HOME=/usr/local/cuda --env LIBRARY_PATH=/usr/local/cuda/lib64/stubs \
    --stop-signal SIGTERM "${LABELS[@]}" "$CTR"
  commit "$IMAGE:$VERSION" "$IMAGE:latest"
  log "gatehouse-agent:$VERSION: $(image_size "$IMAGE:$VERSION") ($((SECONDS - start)) s)"
fi

"${B[@]}" images --filter reference='localhost/gatehouse-*' >&2
