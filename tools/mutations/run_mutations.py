#!/usr/bin/env python3
"""Mutation suite: do the gates catch the adapter bugs real adaptations make?

What
    tools/mutations/manifest.json lists mutations: each a small committed patch
    (tools/mutations/<name>.patch, paths relative to the adapter repository, i.e. models/)
    that reproduces one bug class seen in real adaptations, and the fixture (a checkpoint
    variant of tools/refgen/families) whose cell must catch it. This command

      1. makes the fixtures (transformers' save_pretrained + reference logits);
      2. builds a real git repository from models/ (branch main) and, for every mutation, a
         branch mut/<name> = main + that patch, committed;
      3. starts a real controller (SQLite in the work folder) and one local agent on
         127.0.0.1, exactly as deploy/demo.sh does;
      4. submits over REST one control cell per fixture on main (must PASS: otherwise a
         "caught" mutation proves nothing) and one cell per mutation on its branch;
      5. waits for every verdict and prints a table: mutation, fixture, the gate that failed,
         its key figure, the reason; then the mutation score (caught / total).

    A mutation "survives" when its cell PASSes, or when it ends in error/BLOCKED without a gate
    FAILing (that is not a gate catching the bug). A surviving mutation means a gate is too
    weak: strengthen the gate, not the test.

CLI
    python tools/mutations/run_mutations.py [--build-dir build] [--work var/mutations]
        [--only NAME ...] [--out docs/mutations.md] [--timeout-s 900]
    python tools/mutations/run_mutations.py --check   # every patch still applies (a ctest)
    Exit status 1 unless every control passes and every mutation is caught.
"""

import argparse
import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
FINAL = {"passed", "failed", "error"}


def log(msg):
    print(f"[mutations] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=gatehouse-mutations",
                    "-c", "user.email=mutations@gatehouse.invalid", *args],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def make_repo(repo, mutations):
    """models/ on main, and one branch per mutation with its patch applied and committed."""
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    shutil.copytree(ROOT / "models", repo, dirs_exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "reference adapter")
    for m in mutations:
        git(repo, "checkout", "-q", "-b", f"mut/{m['name']}", "main")
        try:
            git(repo, "apply", "--index", str(HERE / m["patch"]))
        except subprocess.CalledProcessError as e:
            raise SystemExit(f"mutation {m['name']}: {m['patch']} does not apply to models/: "
                             f"{e.stderr.decode(errors='replace').strip()}")
        git(repo, "commit", "-q", "-m", f"mutation {m['name']}: {m['bug']}")
        git(repo, "checkout", "-q", "main")


def http(method, url, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def key_figure(phase):
    """The figure that best shows why a phase failed."""
    figs = {f["name"]: f["value"] for f in phase.get("figures", [])}
    name = phase["phase"]
    def num(v, spec):
        try:
            return format(float(v), spec)
        except (TypeError, ValueError):
            return str(v)
    if name == "inference" and "kl_mean" in figs:
        return f"KL {num(figs['kl_mean'], '.3g')} nats, top-1 {num(figs.get('top1_agreement'), '.1f')} %"
    if name == "decode" and "tokens_matched" in figs:
        return f"{figs['tokens_matched']}/{figs.get('tokens_total')} greedy tokens"
    if name == "load":
        return (f"keys used {figs.get('keys_used', '?')}/{figs.get('keys_total', '?')}, "
                f"missing {figs.get('keys_missing', '?')}, unexpected {figs.get('keys_unexpected', '?')}")
    if name == "config":
        return f"fields unmapped {figs.get('fields_unmapped', '?')}"
    if name == "training" and "loss_step_1" in figs:
        return f"loss {num(figs['loss_step_1'], '.4g')}"
    return ", ".join(f"{k}={v}" for k, v in list(figs.items())[:2]) or "-"


def verdict(cell):
    """(caught_by, figure, reason) of the first non-PASS phase, or (None, ...) if none FAILed."""
    for p in cell.get("phases", []):
        if p["status"] == "FAIL":
            return p["phase"], key_figure(p), p.get("reason", "")
    bad = next((p for p in cell.get("phases", []) if p["status"] not in ("PASS", "SKIPPED")), None)
    attempt = (cell.get("attempts") or [{}])[-1]
    reason = bad.get("reason", "") if bad else attempt.get("reason", "")
    return None, "-", f"{cell.get('status')}: {reason}"


def check_patches(mutations):
    """git apply --check of every patch against a copy of models/ (a patch whose context drifted
    with the code would make the suite silently test nothing). Returns the exit status."""
    bad = []
    with tempfile.TemporaryDirectory(prefix="gh-mutcheck-") as tmp:
        shutil.copytree(ROOT / "models", Path(tmp) / "m")
        for m in mutations:
            proc = subprocess.run(["git", "apply", "--check", str(HERE / m["patch"])],
                                  cwd=Path(tmp) / "m", capture_output=True, text=True)
            print(f"{'ok  ' if proc.returncode == 0 else 'FAIL'} {m['name']} ({m['patch']})"
                  + (f": {proc.stderr.strip()}" if proc.returncode else ""))
            if proc.returncode:
                bad.append(m["name"])
    if bad:
        print(f"{len(bad)} patch(es) no longer apply to models/: regenerate them "
              f"(apply the same bug to the current code, git diff > the .patch)")
    return 1 if bad else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", type=Path, default=ROOT / "build")
    ap.add_argument("--work", type=Path, default=ROOT / "var" / "mutations")
    ap.add_argument("--only", nargs="+", metavar="NAME")
    ap.add_argument("--out", type=Path, help="also write the Markdown table here")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="per cell")
    ap.add_argument("--check", action="store_true",
                    help="only check that every patch still applies to models/ (no build, no run)")
    args = ap.parse_args(argv)
    build = args.build_dir.resolve()
    work = args.work.resolve()
    python = sys.executable

    mutations = json.loads((HERE / "manifest.json").read_text())["mutations"]
    if args.only:
        unknown = set(args.only) - {m["name"] for m in mutations}
        if unknown:
            ap.error(f"unknown mutation(s) {sorted(unknown)}")
        mutations = [m for m in mutations if m["name"] in args.only]
    if args.check:
        return check_patches(mutations)
    fixtures = sorted({m["fixture"] for m in mutations})
    sys.path.insert(0, str(ROOT / "tools" / "refgen"))
    from families import all_variants  # noqa: E402
    variants = all_variants()

    for exe in ("bin/gatehouse-controller", "bin/gatehouse-agent", "bin/gatehouse-worker",
                "sdk/GatehouseWorkerConfig.cmake"):
        if not (build / exe).exists():
            ap.error(f"{build / exe} missing: build gatehouse-controller gatehouse-agent gatehouse-worker")

    log(f"fixtures {fixtures}")
    ckpts = work / "checkpoints"
    subprocess.run([python, str(ROOT / "tools/refgen/make_checkpoint.py"), "--out-root", str(ckpts),
                    "--only", *fixtures], check=True, stdout=subprocess.DEVNULL)
    repo = work / "adapter"
    make_repo(repo, mutations)
    log(f"repository {repo}: main + {len(mutations)} mutation branch(es)")

    for sub in ("gatehouse.db", "gatehouse.db-wal", "gatehouse.db-shm"):
        (work / sub).unlink(missing_ok=True)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    http_port, grpc_port = free_port(), free_port()
    import torch  # the venv's: its version is the runtime pin, its prefix the agent's
    torch_version = torch.__version__.split("+")[0]
    procs = []
    try:
        procs.append(subprocess.Popen(
            [str(build / "bin/gatehouse-controller"), "--db", str(work / "gatehouse.db"),
             "--http", f"127.0.0.1:{http_port}", "--grpc", f"127.0.0.1:{grpc_port}",
             "--mirror-dir", str(work / "mirrors"), "--web-dir", str(ROOT / "web"),
             "--torch-pin", torch_version],
            stdout=open(work / "logs/controller.out", "w"), stderr=open(work / "logs/controller.log", "w")))
        procs.append(subprocess.Popen(
            [str(build / "bin/gatehouse-agent"), "--controller", f"127.0.0.1:{grpc_port}",
             "--name", "mutation-agent", "--work-dir", str(work / "agent"), "--sdk-dir", str(build / "sdk"),
             "--cmake-prefix-path", torch.utils.cmake_prefix_path,
             "--worker", str(build / "bin/gatehouse-worker"), "--torch-version", torch_version],
            stdout=open(work / "logs/agent.out", "w"), stderr=open(work / "logs/agent.log", "w")))
        api = f"http://127.0.0.1:{http_port}/api/v1"
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=2)
                break
            except OSError:
                time.sleep(0.2)

        def submit(branch, fixture):
            body = {"repository": str(repo), "branch": branch,
                    "model_family": variants[fixture].family,
                    "checkpoint": str(ckpts / fixture / "checkpoint"),
                    "reference": str(ckpts / fixture / "reference")}
            code, resp = http("POST", f"{api}/cells", body)
            if code not in (200, 201):
                raise SystemExit(f"submit {branch} on {fixture}: HTTP {code} {resp}")
            return resp["id"]

        cells = {("control", f): submit("main", f) for f in fixtures}
        for m in mutations:
            cells[("mutation", m["name"])] = submit(f"mut/{m['name']}", m["fixture"])
        log(f"{len(cells)} cells submitted; the agent runs them one at a time")

        results, deadline = {}, time.time() + args.timeout_s * len(cells)
        while len(results) < len(cells) and time.time() < deadline:
            for key, cid in cells.items():
                if key in results:
                    continue
                code, cell = http("GET", f"{api}/cells/{cid}")
                if code == 200 and cell["status"] in FINAL:
                    results[key] = cell
                    log(f"{key[0]} {key[1]}: {cell['status']}")
            time.sleep(2)
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()

    rows, controls_ok, caught = [], True, 0
    control_rows = []
    for f in fixtures:
        cell = results.get(("control", f), {"status": "timeout"})
        ok = cell.get("status") == "passed"
        controls_ok &= ok
        control_rows.append(f"| {f} | {variants[f].family} | {cell.get('status')} |")
    for m in mutations:
        cell = results.get(("mutation", m["name"]), {"status": "timeout", "phases": []})
        gate, figure, reason = verdict(cell)
        caught += gate is not None
        rows.append(f"| {m['name']} | {m['bug']} | {m['fixture']} | {gate or 'SURVIVED'} | {figure} | "
                    f"{reason[:200].replace('|', '/')} |")
    score = 100.0 * caught / len(mutations) if mutations else 0.0
    text = "\n".join([
        "# Mutation suite",
        "",
        f"Produced by `tools/mutations/run_mutations.py` on {datetime.date.today().isoformat()}: each "
        "mutation is a committed patch (tools/mutations/) on its own branch of a real git repository, "
        "run end to end (controller, agent, worker) against a checkpoint transformers saved.",
        "",
        "Controls (main branch, unmutated adapter; each must pass):",
        "",
        "| fixture | family | status |",
        "|---|---|---|",
        *control_rows,
        "",
        "| mutation | bug class | fixture | caught by gate | key figure | reason |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"Mutation score: {caught}/{len(mutations)} = {score:.0f} %.",
        "",
    ])
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if controls_ok and caught == len(mutations) else 1


if __name__ == "__main__":
    sys.exit(main())
