"""deploy/k8s, checked without a cluster:

- structure: every manifest is listed by the kustomization and every listed file exists; the
  Service selects the controller's pods and its target ports are container ports; the
  StatefulSet's readiness probe asks GET /healthz on the port its --http flag binds, and its
  --db lives on the volume claim; the agent DaemonSet requests nvidia.com/gpu, runs only on
  labelled nodes, takes its token from the Secret's file (no token in the environment), and
  both run as non-root without privilege escalation;
- the checks catch what they claim (a wrong probe path, a token in an environment variable, a
  missing GPU request, an unlisted manifest);
- the arguments are our binaries' own: the controller started with the StatefulSet's args
  (paths moved under a temporary directory, addresses on 127.0.0.1) answers the readiness
  probe's path, and the agent started with the DaemonSet's args (its token file made by the
  controller, the node name filled in) registers with it.
"""

from __future__ import annotations

import copy
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
BIN = Path(os.environ.get("GATEHOUSE_BIN_DIR", ROOT / "build" / "bin"))


def load() -> tuple[dict, dict[str, dict]]:
    """(kustomization, {"Kind/name": manifest}) of deploy/k8s."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs = {}
    for name in kustomization.get("resources", []):
        for doc in yaml.safe_load_all((K8S / name).read_text()):
            if doc:
                docs[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return kustomization, docs


def container(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]["containers"][0]


def flag(c: dict, name: str) -> str | None:
    for a in c.get("args", []):
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


def problems(kustomization: dict, docs: dict[str, dict], files: list[str]) -> list[str]:
    """Everything wrong with the manifests, as sentences naming the field."""
    out = []
    listed = set(kustomization.get("resources", []))
    for f in files:
        if f != "kustomization.yaml" and f not in listed:
            out.append(f"{f} is not listed in kustomization.yaml resources")
    for f in listed:
        if f not in files:
            out.append(f"kustomization.yaml lists {f}, which does not exist")
    for key, doc in docs.items():
        for field in ("apiVersion", "kind", "metadata"):
            if field not in doc:
                out.append(f"{key}: no {field}")
    sts = docs.get("StatefulSet/gatehouse-controller")
    svc = docs.get("Service/gatehouse-controller")
    ds = docs.get("DaemonSet/gatehouse-agent")
    if not (sts and svc and ds):
        return out + ["missing one of StatefulSet/Service gatehouse-controller, DaemonSet gatehouse-agent"]
    # Controller: Service -> pods and ports.
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    if any(pod_labels.get(k) != v for k, v in svc["spec"]["selector"].items()):
        out.append("Service gatehouse-controller: selector does not match the StatefulSet's pods")
    c = container(sts)
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    for p in svc["spec"]["ports"]:
        if p["targetPort"] not in ports:
            out.append(f"Service port {p['name']}: targetPort {p['targetPort']} is no container port")
    probe = c.get("readinessProbe", {}).get("httpGet", {})
    if probe.get("path") != "/healthz":
        out.append(f"controller readinessProbe path {probe.get('path')!r} is not /healthz")
    http = flag(c, "http") or ""
    if probe.get("port") not in ports or http.rsplit(":", 1)[-1] != str(ports.get(probe.get("port"))):
        out.append(f"controller readinessProbe port {probe.get('port')!r} is not the port --http binds ({http})")
    claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    db = flag(c, "db") or ""
    if not any(db.startswith(mounts[n] + "/") for n in claims if n in mounts):
        out.append(f"controller --db {db!r} is not on a volumeClaimTemplate's mount")
    # Agent.
    a = container(ds)
    pod = ds["spec"]["template"]["spec"]
    if "nvidia.com/gpu" not in a.get("resources", {}).get("limits", {}):
        out.append("agent: resources.limits has no nvidia.com/gpu")
    if not pod.get("nodeSelector"):
        out.append("agent: no nodeSelector (it would run on every node)")
    token = flag(a, "token-file") or ""
    secret_mounts = {v["name"] for v in pod.get("volumes", []) if "secret" in v}
    a_mounts = {m["name"]: m["mountPath"] for m in a.get("volumeMounts", [])}
    if not any(os.path.dirname(token) == a_mounts.get(n) for n in secret_mounts):
        out.append(f"agent --token-file {token!r} is not in a Secret volume's mount")
    for e in a.get("env", []):
        if "TOKEN" in e["name"].upper() or "secretKeyRef" in str(e.get("valueFrom", "")):
            out.append(f"agent: env {e['name']} carries a secret (tokens come as files)")
    if "--controller=gatehouse-controller:" + str(ports.get("grpc")) not in a.get("args", []):
        out.append("agent --controller is not the controller Service's grpc port")
    for key, d in (("controller", sts), ("agent", ds)):
        spec = d["spec"]["template"]["spec"]
        if not spec.get("securityContext", {}).get("runAsNonRoot"):
            out.append(f"{key}: not runAsNonRoot")
        if container(d).get("securityContext", {}).get("allowPrivilegeEscalation") is not False:
            out.append(f"{key}: allowPrivilegeEscalation is not false")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class K8sManifestsTest(unittest.TestCase):
    def setUp(self):
        self.kustomization, self.docs = load()
        self.files = sorted(p.name for p in K8S.glob("*.yaml"))

    def test_manifests_are_consistent(self):
        self.assertEqual(problems(self.kustomization, self.docs, self.files), [])

    def test_checks_catch_mistakes(self):
        def broken(edit):
            docs = copy.deepcopy(self.docs)
            edit(docs)
            return problems(self.kustomization, docs, self.files)

        def probe(d):
            container(d["StatefulSet/gatehouse-controller"])["readinessProbe"]["httpGet"]["path"] = "/health"
        self.assertTrue(any("readinessProbe path" in p for p in broken(probe)))

        def env_token(d):
            container(d["DaemonSet/gatehouse-agent"])["env"].append(
                {"name": "GATEHOUSE_AGENT_TOKEN", "valueFrom": {"secretKeyRef": {"name": "t", "key": "k"}}})
        self.assertTrue(any("carries a secret" in p for p in broken(env_token)))

        def no_gpu(d):
            container(d["DaemonSet/gatehouse-agent"])["resources"]["limits"].pop("nvidia.com/gpu")
        self.assertTrue(any("nvidia.com/gpu" in p for p in broken(no_gpu)))
        self.assertTrue(any("not listed" in p for p in
                            problems(self.kustomization, self.docs, self.files + ["extra.yaml"])))

    def test_controller_and_agent_run_with_the_manifest_args(self):
        missing = [b for b in ("gatehouse-controller", "gatehouse-agent") if not (BIN / b).is_file()]
        if missing:
            self.skipTest(f"not built in {BIN}: {missing}")
        tmp = Path(tempfile.mkdtemp(prefix="gh-k8s-"))
        self.addCleanup(shutil.rmtree, tmp, True)
        http, grpc = free_port(), free_port()

        def local(arg: str) -> str:
            arg = arg.replace("/var/lib/", f"{tmp}/var/lib/").replace("/var/cache/", f"{tmp}/var/cache/")
            arg = arg.replace("/run/secrets/", f"{tmp}/run/secrets/").replace("/opt/gatehouse", str(ROOT))
            arg = arg.replace("0.0.0.0:8080", f"127.0.0.1:{http}").replace("0.0.0.0:50051", f"127.0.0.1:{grpc}")
            return arg.replace("gatehouse-controller:50051", f"127.0.0.1:{grpc}").replace(
                "$(NODE_NAME)", "k8s-node-test")

        ctl_args = [local(a) for a in container(self.docs["StatefulSet/gatehouse-controller"])["args"]]
        (tmp / "var/lib/gatehouse").mkdir(parents=True)
        db = flag({"args": ctl_args}, "db")
        token = subprocess.run([str(BIN / "gatehouse-controller"), f"--db={db}", "tokens", "create",
                                "--name", "gpu-pool", "--kind", "agent"],
                               capture_output=True, text=True, timeout=60, check=True).stdout.strip()
        logs = open(tmp / "controller.log", "w")
        self.addCleanup(logs.close)
        ctl = subprocess.Popen([str(BIN / "gatehouse-controller"), *ctl_args], stdout=logs, stderr=logs)
        self.addCleanup(lambda: (ctl.terminate(), ctl.wait(timeout=30)))
        probe = container(self.docs["StatefulSet/gatehouse-controller"])["readinessProbe"]["httpGet"]["path"]
        deadline, ready = time.monotonic() + 30, None
        while time.monotonic() < deadline and ready is None:
            try:
                ready = urllib.request.urlopen(f"http://127.0.0.1:{http}{probe}", timeout=2).status
            except OSError:
                time.sleep(0.2)
        self.assertEqual(ready, 200, (tmp / "controller.log").read_text())

        agent_c = container(self.docs["DaemonSet/gatehouse-agent"])
        agent_args = [local(a) for a in agent_c["args"]]
        token_file = Path(flag({"args": agent_args}, "token-file"))
        token_file.parent.mkdir(parents=True)
        token_file.write_text(token + "\n")
        env = dict(os.environ, **{e["name"]: local(e["value"]) for e in agent_c["env"] if "value" in e})
        agent_log = open(tmp / "agent.log", "w")
        self.addCleanup(agent_log.close)
        agent = subprocess.Popen([str(BIN / "gatehouse-agent"), *agent_args], stdout=subprocess.PIPE,
                                 stderr=agent_log, text=True, env=env)
        self.addCleanup(lambda: (agent.terminate(), agent.wait(timeout=30), agent.stdout.close()))
        line = agent.stdout.readline()
        self.assertIn("registered as", line, (tmp / "agent.log").read_text())
        print(f"controller ready on {probe}; agent: {line.strip()}")


if __name__ == "__main__":
    sys.exit(unittest.main(verbosity=2))
