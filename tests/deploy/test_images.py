"""deploy/images/build.sh, checked by building the controller image and running it:

- the image is built from scratch by the script (debootstrap root cached in the build tree,
  buildah with its storage under a temporary directory, removed afterwards);
- its config is what deploy/k8s/controller.yaml relies on: the StatefulSet's runAsUser (999) is
  the image's user, its container ports are exposed, its --web-dir exists in the image; the
  entrypoint is /opt/gatehouse/bin/gatehouse-controller; OCI labels carry version and revision;
- its contents are the smallest sensible: the controller and the dashboard files, no compiler
  (no gcc, g++, cc, c++, cc1 anywhere); the size is printed and held under a bar;
- the controller runs in it with the StatefulSet's own args (state on a volume, addresses moved to
  127.0.0.1 on free ports): GET /healthz answers 200, the dashboard is served, the process runs
  as uid 999 and the database it makes belongs to 999. Run with `podman run --network=host`
  (read-only root, all capabilities dropped, as the manifest's securityContext) where podman can
  start containers here, else with `buildah run --isolation=chroot`.

Skipped (exit 77, ctest SKIP_RETURN_CODE) with the reason where it cannot run: not root, no
debootstrap or buildah, the controller not built, Debian's mirror unreachable."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_k8s_manifests import container, flag, free_port, load  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BUILD_SH = ROOT / "deploy" / "images" / "build.sh"
BIN = Path(os.environ.get("GATEHOUSE_BIN_DIR", ROOT / "build" / "bin"))
CACHE = Path(os.environ.get("GATEHOUSE_IMAGE_CACHE", BIN.parent / "images-cache"))
MIRROR = os.environ.get("GATEHOUSE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SKIP_RETURN_CODE = 77
IMAGE = "localhost/gatehouse-controller:latest"
SIZE_BAR = 200 * 1000 * 1000  # bytes; the image measured 127 MB (docs/deploy.md)
BUILD_TIMEOUT_S = 420
# Runtime state directories podman and its OCI runtimes make in /run; the test removes the ones it
# made (when empty again) so that it leaves nothing behind.
RUNTIME_DIRS = [Path(p) for p in ("/run/crun", "/run/runc", "/run/libpod", "/run/containers")]


def missing_prerequisite() -> str | None:
    if os.geteuid() != 0:
        return "needs root (debootstrap and chroot)"
    for tool in ("debootstrap", "buildah"):
        if not shutil.which(tool):
            return f"{tool} is not installed (deploy/setup.sh installs it)"
    if not (BIN / "gatehouse-controller").is_file():
        return f"gatehouse-controller is not built in {BIN}"
    try:
        urllib.request.urlopen(f"{MIRROR}/dists/bookworm/InRelease", timeout=15).close()
    except OSError as e:
        return f"Debian mirror {MIRROR} unreachable: {e}"
    return None


def run(cmd: list[str], timeout: float = 120, check: bool = True, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    return [p for p in points if p == str(path) or p.startswith(str(path) + "/")]


def pids_with_arg(arg: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if arg in (d / "cmdline").read_bytes().decode(errors="replace").split("\0"):
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])  # real uid
    raise AssertionError(f"no Uid in /proc/{pid}/status")


class ControllerImageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.runtime_dirs_before = {p for p in RUNTIME_DIRS if p.exists()}
        cls.tmp = Path(tempfile.mkdtemp(prefix="gh-images-"))
        cls.storage = ["--storage-driver", "vfs", "--root", str(cls.tmp / "root"),
                       "--runroot", str(cls.tmp / "runroot")]
        cls.buildah = ["buildah", *cls.storage]
        cls.podman = None
        try:
            start = time.monotonic()
            r = run([str(BUILD_SH), "--build-dir", str(BIN.parent), "--cache-dir", str(CACHE), "--mirror", MIRROR,
                     "--root", str(cls.tmp / "root"), "--runroot", str(cls.tmp / "runroot")],
                    timeout=BUILD_TIMEOUT_S, check=False)
            cls.build_s = time.monotonic() - start
            cls.build_log = r.stderr
            if r.returncode != 0:
                raise AssertionError(f"build.sh exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-6000:]}")
            print(f"build.sh: {cls.build_s:.0f} s", flush=True)
            cls.config = json.loads(run([*cls.buildah, "inspect", "--type", "image", IMAGE]).stdout)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        if cls.podman:
            subprocess.run([*cls.podman, "rm", "--all", "--force"], capture_output=True, timeout=120)
        subprocess.run([*cls.buildah, "rm", "--all"], capture_output=True, timeout=120)
        subprocess.run([*cls.buildah, "rmi", "--all", "--force"], capture_output=True, timeout=300)
        for point in sorted(mounts_under(cls.tmp), reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, timeout=60)
        shutil.rmtree(cls.tmp, ignore_errors=True)
        for p in RUNTIME_DIRS:
            if p not in cls.runtime_dirs_before and p.is_dir():
                for d in sorted((x for x in p.rglob("*") if x.is_dir()), reverse=True):
                    try:
                        d.rmdir()
                    except OSError:
                        pass
                try:
                    p.rmdir()
                except OSError:
                    pass

    def setUp(self):
        _, self.docs = load()
        self.sts = self.docs["StatefulSet/gatehouse-controller"]

    # --- config -------------------------------------------------------------------------------

    def test_config_matches_the_manifest(self):
        cfg = self.config["OCIv1"]["config"]
        pod = self.sts["spec"]["template"]["spec"]
        c = container(self.sts)
        uid = pod["securityContext"]["runAsUser"]
        self.assertEqual(cfg["User"], f"{uid}:{pod['securityContext']['runAsGroup']}")
        self.assertEqual(cfg["Entrypoint"], ["/opt/gatehouse/bin/gatehouse-controller"])
        for p in c["ports"]:
            self.assertIn(f"{p['containerPort']}/tcp", cfg["ExposedPorts"])
        self.assertEqual(cfg["WorkingDir"], "/var/lib/gatehouse")
        # The image's default command is the manifest's, but for the torch pin (a cluster's choice).
        self.assertEqual(sorted(cfg["Cmd"]), sorted(a for a in c["args"] if not a.startswith("--torch-pin")))
        labels = cfg["Labels"]
        for key in ("title", "version", "revision", "created"):
            self.assertTrue(labels.get(f"org.opencontainers.image.{key}"), key)
        self.assertEqual(labels["org.opencontainers.image.title"], "gatehouse-controller")
        history = [h.get("created_by", "") for h in self.config["OCIv1"]["history"]]
        self.assertEqual(len(history), 3, history)  # base, runtime packages, gatehouse
        print(f"image version {labels['org.opencontainers.image.version']}, layers: {history}")

    # --- contents -----------------------------------------------------------------------------

    def test_contents_are_small(self):
        ctr = run([*self.buildah, "from", "--pull=never", "--quiet", IMAGE]).stdout.strip()
        self.addCleanup(run, [*self.buildah, "rm", ctr], 120, False)
        mnt = Path(run([*self.buildah, "mount", ctr]).stdout.strip())
        self.addCleanup(run, [*self.buildah, "unmount", ctr], 120, False)
        binary = mnt / "opt/gatehouse/bin/gatehouse-controller"
        self.assertTrue(binary.is_file() and os.access(binary, os.X_OK), binary)
        web = flag(container(self.sts), "web-dir")
        self.assertTrue((mnt / web.lstrip("/") / "index.html").is_file(), f"{web}/index.html")
        passwd = (mnt / "etc/passwd").read_text()
        self.assertIn("gatehouse:x:999:999:", passwd)
        compilers = [str(p.relative_to(mnt)) for pattern in
                     ("usr/bin/gcc*", "usr/bin/g++*", "usr/bin/cc", "usr/bin/c++", "usr/bin/*-gcc*",
                      "usr/bin/clang*", "usr/lib/gcc/*/*/cc1*", "usr/libexec/gcc/*/*/cc1*")
                     for p in mnt.glob(pattern)]
        self.assertEqual(compilers, [], "a compiler in the controller image")
        self.assertFalse((mnt / "var/lib/apt/lists").exists() and
                         any(p.is_file() and p.name != "lock" for p in (mnt / "var/lib/apt/lists").iterdir()),
                         "apt lists left in the image")
        size = self.image_bytes(mnt)
        shown = run([*self.buildah, "images", "--noheading", "--format", "{{.Size}}", IMAGE]).stdout.split("\n")[0]
        print(f"gatehouse-controller image: {size / 1e6:.1f} MB of files (buildah images: {shown})")
        self.assertLess(size, SIZE_BAR)

    @staticmethod
    def image_bytes(root: Path) -> int:
        total = 0
        for dirpath, _, files in os.walk(root):
            for f in files:
                try:
                    st = os.lstat(os.path.join(dirpath, f))
                except OSError:
                    continue
                total += st.st_size
        return total

    # --- running ------------------------------------------------------------------------------

    def podman_command(self) -> list[str] | None:
        """podman with this test's storage and a runtime that starts containers here, or None."""
        if not shutil.which("podman"):
            print("podman is not installed: running with buildah run --isolation=chroot")
            return None
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        nofile = min(soft, 65536)
        # Without CAP_SYS_RESOURCE (an unprivileged container) podman's default limits, above
        # ours, cannot be set: ask for limits below them.
        self.ulimits = ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", "nproc=4096:4096"]
        base = ["podman", *self.storage, "--tmpdir", str(self.tmp / "podman"),
                "--cgroup-manager", "cgroupfs", "--events-backend", "file"]
        tried = []
        for runtime in (None, "runc"):
            if runtime and not shutil.which(runtime):
                continue
            cmd = base + (["--runtime", runtime, "--runtime-flag", f"root={self.tmp / ('state-' + runtime)}"]
                          if runtime else [])
            r = subprocess.run([*cmd, "run", "--rm", "--network=host", *self.ulimits,
                                "--entrypoint", "/bin/true", IMAGE], capture_output=True, text=True, timeout=120)
            if r.returncode == 0:
                type(self).podman = cmd
                self.runtime = runtime or "default runtime"
                return cmd
            tried.append(f"{runtime or 'default runtime'}: {r.stderr.strip().splitlines()[-1:]}")
            subprocess.run([*cmd, "rm", "--all", "--force"], capture_output=True, timeout=60)
        print(f"podman cannot start containers here ({'; '.join(tried)}): "
              "running with buildah run --isolation=chroot")
        return None

    def test_controller_serves_healthz_as_999(self):
        c = container(self.sts)
        http, grpc = free_port(), free_port()
        args = [a.replace("0.0.0.0:8080", f"127.0.0.1:{http}").replace("0.0.0.0:50051", f"127.0.0.1:{grpc}")
                for a in c["args"]]
        state_mount = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["state"]
        state = self.tmp / "state"
        state.mkdir()
        os.chown(state, 999, 999)
        state.chmod(0o700)
        log_path = self.tmp / "controller.log"
        log = open(log_path, "w")
        self.addCleanup(log.close)
        podman = self.podman_command()
        if podman:
            # As the StatefulSet: read-only root, no capabilities, no privilege escalation.
            cmd = [*podman, "run", "--rm", "--name", "gh-controller-test", "--network=host", *self.ulimits,
                   "--read-only", "--cap-drop=all", "--security-opt=no-new-privileges",
                   "-v", f"{state}:{state_mount}", IMAGE, *args]
            how = f"podman run ({self.runtime})"
        else:
            ctr = run([*self.buildah, "from", "--pull=never", "--quiet", IMAGE]).stdout.strip()
            self.addCleanup(run, [*self.buildah, "rm", ctr], 120, False)
            entrypoint = self.config["OCIv1"]["config"]["Entrypoint"]
            cmd = [*self.buildah, "run", "--isolation=chroot", "--network=host", "--cap-drop=all",
                   "-v", f"{state}:{state_mount}", ctr, "--", *entrypoint, *args]
            how = "buildah run --isolation=chroot"
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

        def stop():
            if podman:
                subprocess.run([*podman, "stop", "--time", "10", "gh-controller-test"], capture_output=True, timeout=60)
            for pid in pids_with_arg(f"--http=127.0.0.1:{http}"):
                if pid != proc.pid:
                    try:
                        os.kill(pid, 15)
                    except OSError:
                        pass
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        self.addCleanup(stop)

        probe = c["readinessProbe"]["httpGet"]["path"]
        deadline, status = time.monotonic() + 60, None
        while time.monotonic() < deadline and status is None and proc.poll() is None:
            try:
                status = urllib.request.urlopen(f"http://127.0.0.1:{http}{probe}", timeout=2).status
            except OSError:
                time.sleep(0.3)
        self.assertEqual(status, 200, f"{how}: {log_path.read_text()[-4000:]}")
        page = urllib.request.urlopen(f"http://127.0.0.1:{http}/", timeout=5).read().decode()
        self.assertIn("<html", page.lower())
        # The controller process (found by its own --http argument) runs as the image's user.
        pids = [p for p in pids_with_arg(f"--http=127.0.0.1:{http}")
                if Path(f"/proc/{p}/exe").resolve().name == "gatehouse-controller"]
        self.assertTrue(pids, "no gatehouse-controller process found")
        self.assertEqual({uid_of(p) for p in pids}, {999})
        db = state / Path(flag({"args": args}, "db")).relative_to(state_mount)
        self.assertTrue(db.is_file(), db)
        self.assertEqual(db.stat().st_uid, 999)
        print(f"{how}: GET {probe} -> 200 on 127.0.0.1:{http}, controller uid 999")

    # --- the script itself --------------------------------------------------------------------

    def test_script_usage(self):
        r = run([str(BUILD_SH), "--help"])
        self.assertIn("Usage: deploy/images/build.sh", r.stdout)
        self.assertIn("--agent", r.stdout)
        r = run([str(BUILD_SH), "--no-such-option"], check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown argument", r.stderr)


if __name__ == "__main__":
    reason = missing_prerequisite()
    if reason:
        print(f"SKIP: {reason}")
        sys.exit(SKIP_RETURN_CODE)
    sys.exit(0 if unittest.main(verbosity=2, exit=False).result.wasSuccessful() else 1)
