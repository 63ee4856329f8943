"""The systemd units in deploy/systemd, checked by systemd's own tools (Debian's systemd 252):

- `systemd-analyze verify` on each unit with /opt/gatehouse replaced by this tree (verify also
  checks that every ExecStart binary exists): no error and no warning;
- `systemd-analyze security --offline=yes --threshold=...`: each unit's exposure stays at or
  below its bar (the agent's is higher: it keeps the GPUs and executable memory);
- the agent's token arrives as a credential, never through the environment;
- the isolation drop-in (gatehouse-agent.service.d/isolation.conf) verifies with the unit;
- `systemd-sysusers --root` makes both system users from deploy/systemd/gatehouse.sysusers;
- the checks themselves: a unit with an unknown key, and one whose binary is missing, fail verify.

Skipped, with the reason, where systemd-analyze or the built binaries are missing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
BIN = Path(os.environ.get("GATEHOUSE_BIN_DIR", ROOT / "build" / "bin"))
# Exposure bars (systemd-analyze security: 0 = fully confined, 10 = unconfined; "OK" up to 3.9).
EXPOSURE_BAR = {"gatehouse-controller.service": 1.5, "gatehouse-agent.service": 2.5}


def rendered(unit: str, out_dir: Path, edit=lambda text: text) -> Path:
    """`unit` with the production tree /opt/gatehouse pointed at this checkout and its build."""
    text = (UNITS / unit).read_text()
    text = text.replace("/opt/gatehouse/build/bin", str(BIN)).replace("/opt/gatehouse", str(ROOT))
    path = out_dir / unit
    path.write_text(edit(text))
    return path


def verify(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True,
                          text=True, timeout=60)


@unittest.skipUnless(shutil.which("systemd-analyze"), "systemd-analyze is not installed")
class SystemdUnitsTest(unittest.TestCase):
    def setUp(self):
        missing = [b for b in ("gatehouse-controller", "gatehouse-agent") if not (BIN / b).is_file()]
        if missing:
            self.skipTest(f"not built in {BIN}: {missing}")
        self.tmp = Path(tempfile.mkdtemp(prefix="gh-systemd-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def test_units_verify_cleanly(self):
        for unit in EXPOSURE_BAR:
            r = verify(rendered(unit, self.tmp))
            self.assertEqual(r.returncode, 0, f"{unit}: {r.stderr}")
            self.assertEqual(r.stderr.strip(), "", f"{unit}: systemd-analyze warned")

    def test_exposure_within_bar(self):
        for unit, bar in EXPOSURE_BAR.items():
            r = subprocess.run(["systemd-analyze", "security", "--offline=yes",
                                f"--threshold={int(bar * 10)}", "--no-pager",
                                str(rendered(unit, self.tmp))],
                               capture_output=True, text=True, timeout=60)
            level = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout + r.stderr)
            self.assertIsNotNone(level, r.stdout + r.stderr)
            print(f"{unit}: exposure {level.group(1)} (bar {bar})")
            self.assertEqual(r.returncode, 0, f"{unit}: exposure {level.group(1)} > {bar}")

    def test_isolation_drop_in_verifies_and_is_read(self):
        # The drop-in that lets the agent sandbox and limit attempts (docs/deploy.md): the unit
        # with it verifies cleanly, its exposure is printed, and verify does read it (a broken
        # drop-in beside the unit fails).
        unit = rendered("gatehouse-agent.service", self.tmp)
        drop_in = self.tmp / "gatehouse-agent.service.d" / "isolation.conf"
        drop_in.parent.mkdir()
        text = (UNITS / "gatehouse-agent.service.d" / "isolation.conf").read_text()
        for needed in ("Delegate=memory pids", "ProtectControlGroups=no",
                       "RestrictNamespaces=user net mnt pid ipc uts", "--sandbox=bwrap",
                       "--cgroup=required", "--attempt-memory-limit="):
            self.assertIn(needed, text)
        drop_in.write_text(text)
        r = verify(unit)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr.strip(), "", "systemd-analyze warned")
        r = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager",
                            str(unit)], capture_output=True, text=True, timeout=60)
        level = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout + r.stderr)
        self.assertIsNotNone(level, r.stdout + r.stderr)
        print(f"gatehouse-agent.service with isolation.conf: exposure {level.group(1)} (bar 3.9)")
        self.assertLessEqual(float(level.group(1)), 3.9, "still 'OK' in systemd's scale")
        drop_in.write_text(text.replace("Delegate=", "DelegateAll="))
        self.assertIn("Unknown key", verify(unit).stderr)

    def test_agent_token_is_a_credential(self):
        text = (UNITS / "gatehouse-agent.service").read_text()
        self.assertIn("LoadCredential=agent-token:/etc/gatehouse/agent.token", text)
        self.assertIn("--token-file %d/agent-token", text)
        self.assertNotIn("GATEHOUSE_AGENT_TOKEN", text)

    def test_units_run_as_their_own_users(self):
        for unit, user in (("gatehouse-controller.service", "gatehouse"),
                           ("gatehouse-agent.service", "gatehouse-agent")):
            self.assertIn(f"\nUser={user}\n", (UNITS / unit).read_text(), unit)
        if not shutil.which("systemd-sysusers"):
            self.skipTest("systemd-sysusers is not installed")
        (self.tmp / "etc").mkdir()
        r = subprocess.run(["systemd-sysusers", f"--root={self.tmp}",
                            str(UNITS / "gatehouse.sysusers")],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        users = {line.split(":")[0]: line for line in (self.tmp / "etc/passwd").read_text().splitlines()}
        for user in ("gatehouse", "gatehouse-agent"):
            self.assertIn(user, users)
            self.assertTrue(users[user].endswith(":/usr/sbin/nologin"), users[user])

    def test_verify_catches_a_broken_unit(self):
        unknown = rendered("gatehouse-agent.service", self.tmp,
                           lambda t: t.replace("[Service]\n", "[Service]\nRestartAlways=yes\n"))
        r = verify(unknown)
        self.assertIn("Unknown key", r.stderr)
        missing = rendered("gatehouse-controller.service", self.tmp,
                           lambda t: t.replace(f"{BIN}/gatehouse-controller", "/nonexistent/gatehouse-controller"))
        r = verify(missing)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("is not executable", r.stderr)


if __name__ == "__main__":
    sys.exit(unittest.main(verbosity=2))
