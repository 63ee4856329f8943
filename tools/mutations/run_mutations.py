#!/usr/bin/env python3
"""Mutation suite: do the gates catch the adapter bugs real adaptations make?

What
    tools/mutations/manifest.json lists mutations: each a small committed patch
    (tools/mutations/<name>.patch, paths relative to the adapter repository, i.e. models/; for
    "lane": "python", tools/mutations/python/<name>.patch relative to adapters/python, whose
    repository carries a lane-python recipe naming both reference SPECs)
    that reproduces one bug seen in real adaptations, its class (what kind of gate weakness it
    probes: "classic", "bars" for numerics only a bar at upstream's floor catches, "decode" for
    bugs of the KV-cached decode path alone, "training" for backward and optimizer bugs a
    finite-gradient check misses, "hub_config" for config fields as the Hub ships them,
    "packing" for packed rows, "logprob" for rollout paths that drift from the training
    forward), the fixture (a checkpoint variant of tools/refgen/families) whose cell must catch
    it, the cell's precision (default fp32) and, optionally, its phases (default: the
    controller's; a mutation that names them shows a gate catching the bug on its own, e.g.
    without the decode gate that would catch it first). This command

      1. makes the fixtures (transformers' save_pretrained + reference logits);
      2. builds a real git repository from models/ (branch main) and, for every mutation, a
         branch mut/<name> = main + that patch, committed;
      3. starts a real controller (SQLite in the work folder) and local agents (--agents,
         default 2; the second once the first has built main, so it reuses ccache's objects)
         on 127.0.0.1, as deploy/demo.sh does, with bearer tokens made by the
         controller's own `tokens create` (an API token for this script, an agent token);
      4. submits over REST one control cell per (fixture, precision) on main (must PASS:
         otherwise a "caught" mutation proves nothing) and one cell per mutation on its branch;
      5. waits for every verdict and prints a table: mutation, fixture, the gate that failed,
         its key figure, the reason; then the mutation score (caught / total).

    A mutation "survives" when its cell PASSes, or when it ends in error/BLOCKED without a gate
    FAILing (that is not a gate catching the bug). A surviving mutation means a gate is too
    weak: strengthen the gate, not the test. The one exception is named in the manifest
    ("envelope_lets_through": why): a bug whose effect is the size of the envelope of correct
    implementations (bf16-only casts), listed with its figures against the bars.

    Beside them, the false-FAIL suite (tools/mutations/variants.py, tools/variants/): correct
    implementations written as our users' frameworks write them, each cell of which must PASS.
    Every cell (control, mutation, variant) compares with a copy of its fixture's bundle that
    holds the envelope of correct implementations (tools/refgen/envelope.py, made under
    <work>/envelopes), so the bars are the ones a user's reference cell gives: the mutations
    must FAIL against the envelope, the variants PASS inside it.

CLI
    python tools/mutations/run_mutations.py [--build-dir build] [--work var/mutations]
        [--only NAME ...] [--classes CLASS ...] [--variants NAME ...|all|none]
        [--out docs/mutations.md] [--timeout-s 900]
    python tools/mutations/run_mutations.py --check   # every patch still applies (a ctest)
    Exit status 1 unless every control passes, every mutation is caught (or let through by the
    envelope as its manifest entry says) and every correct variant passes. --variants defaults to all, or none when --only / --classes narrow the
    mutations.
"""

import argparse
import datetime
import json
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
FINAL = {"passed", "failed", "error", "blocked", "cancelled", "timed_out"}
sys.path.insert(0, str(HERE))
import variants as variant_suite  # noqa: E402  (the false-FAIL suite)


def log(msg):
    print(f"[mutations] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


git = variant_suite.git
GENERATED = variant_suite.GENERATED


# The adapter each lane's repository holds (manifest "lane", default "cpp"): the C++ families
# (models/, CMake recipe) or the Python reference adapters (adapters/python, recipe lane
# "python" with both SPECs), docs/protocols.md §5.
LANE_SOURCE = {"cpp": ROOT / "models", "python": ROOT / "adapters" / "python"}
PYTHON_RECIPE = {"recipe_version": 1, "lane": "python",
                 "build": {"system": "pip", "source_dir": "."},
                 "entries": ["gh_archon.llama.spec:SPEC", "gh_archon.qwen3_moe.spec:SPEC"]}


def lane_of(m):
    return m.get("lane", "cpp")


def copy_lane_source(lane, dest):
    shutil.copytree(LANE_SOURCE[lane], dest, dirs_exist_ok=True, ignore=GENERATED)
    if lane == "python":
        (dest / "gatehouse.recipe.json").write_text(json.dumps(PYTHON_RECIPE, indent=1) + "\n")


def make_repo(repo, mutations, lane="cpp"):
    """The lane's adapter on main, and one branch per mutation with its patch applied and
    committed."""
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    copy_lane_source(lane, repo)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "reference adapter")
    for m in mutations:
        git(repo, "checkout", "-q", "-b", f"mut/{m['name']}", "main")
        try:
            git(repo, "apply", "--index", str(HERE / m["patch"]))
        except subprocess.CalledProcessError as e:
            raise SystemExit(f"mutation {m['name']}: {m['patch']} does not apply to "
                             f"{LANE_SOURCE[lane].relative_to(ROOT)}: "
                             f"{e.stderr.decode(errors='replace').strip()}")
        git(repo, "commit", "-q", "-m", f"mutation {m['name']}: {m['bug']}")
        git(repo, "checkout", "-q", "main")


def http(method, url, body=None, token=None):
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
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
    if name == "inference" and "max_abs_diff" in figs:
        return (f"max abs {num(figs['max_abs_diff'], '.3g')} (bar {num(figs.get('bar_max_abs_diff'), '.3g')}), "
                f"KL {num(figs.get('kl_mean'), '.3g')} nats, top-1 {num(figs.get('top1_agreement'), '.1f')} %")
    if name == "decode" and "steps_max_abs_diff" in figs:
        return (f"{figs.get('tokens_matched')}/{figs.get('tokens_total')} greedy tokens, step logits "
                f"max abs {num(figs['steps_max_abs_diff'], '.3g')} (bar {num(figs.get('steps_bar_max_abs_diff'), '.3g')})")
    if name == "training" and "upstream_trainable_keys" in figs and "grad_norm_max_rel_diff" not in figs:
        return f"trainable keys {figs.get('trainable_keys')} vs upstream's {figs['upstream_trainable_keys']}"
    if name == "training" and "grad_norm_max_rel_diff" in figs:
        return (f"grad norm rel diff {num(figs['grad_norm_max_rel_diff'], '.3g')} "
                f"({figs.get('grad_norm_worst_key', '?')}), step-2 loss rel diff "
                f"{num(figs.get('loss_rel_diff_step_2'), '.3g')}")
    if name == "inference" and "kl_mean" in figs:
        return f"KL {num(figs['kl_mean'], '.3g')} nats, top-1 {num(figs.get('top1_agreement'), '.1f')} %"
    if name == "decode" and "tokens_matched" in figs:
        return f"{figs['tokens_matched']}/{figs.get('tokens_total')} greedy tokens"
    if name == "packing" and "kl_max" in figs:
        return (f"packed vs alone: KL max {num(figs['kl_max'], '.3g')} nats (bar "
                f"{num(figs.get('bar_kl_max'), '.3g')}), top-1 {num(figs.get('top1_agreement'), '.1f')} %, "
                f"loss rel diff {num(figs.get('loss_rel_diff'), '.3g')} (bar "
                f"{num(figs.get('bar_loss_rel'), '.3g')}), gradient rel diff "
                f"{num(figs.get('grad_rel_diff_max'), '.3g')} (bar {num(figs.get('bar_grad_rel'), '.3g')})")
    if name == "logprob_parity" and "mean_abs_diff" in figs:
        return (f"rollout vs training log-probs: mean abs {num(figs['mean_abs_diff'], '.3g')} nats "
                f"(bar {num(figs.get('bar_mean_abs_diff'), '.3g')}), max "
                f"{num(figs.get('max_abs_diff'), '.3g')} (bar "
                f"{num(figs.get('bar_max_abs_diff'), '.3g')}), k3 KL {num(figs.get('k3_kl'), '.3g')}")
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
        for lane in LANE_SOURCE:
            copy_lane_source(lane, Path(tmp) / lane)
        for m in mutations:
            proc = subprocess.run(["git", "apply", "--check", str(HERE / m["patch"])],
                                  cwd=Path(tmp) / lane_of(m), capture_output=True, text=True)
            print(f"{'ok  ' if proc.returncode == 0 else 'FAIL'} {m['name']} ({m['patch']})"
                  + (f": {proc.stderr.strip()}" if proc.returncode else ""))
            if proc.returncode:
                bad.append(m["name"])
    bad += variant_suite.check_patches()
    if bad:
        print(f"{len(bad)} patch(es) no longer apply to their lane's adapter: regenerate them "
              f"(apply the same change to the current code, git diff > the .patch)")
    return 1 if bad else 0


def prepare_references(python, ckpts, fixtures, root):
    """Per fixture, root/<fixture>/reference: a copy of its bundle holding the envelope of
    correct implementations (tools/refgen/envelope.py; measured again only when the fixture's
    bundle changed), and root/<fixture>/checkpoint, a link to its checkpoint (so root reads
    like a fixture folder, e.g. for tests/python/test_variant_adapters.py). Returns {fixture:
    bundle dir}."""
    import filecmp
    out, pairs = {}, []
    for fixture in fixtures:
        source, dest = ckpts / fixture / "reference", root / fixture / "reference"
        fresh = (dest / "reference.safetensors").is_file() and filecmp.cmp(
            source / "reference.safetensors", dest / "reference.safetensors", shallow=False)
        if fresh:
            meta = json.loads((dest / "reference.json").read_text())
            meta.pop("envelope", None)
            fresh = meta == json.loads((source / "reference.json").read_text())
        if not fresh:
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(source, dest)
        link = root / fixture / "checkpoint"
        if not link.is_symlink() or link.resolve() != (ckpts / fixture / "checkpoint").resolve():
            link.unlink(missing_ok=True)
            link.symlink_to((ckpts / fixture / "checkpoint").resolve(), target_is_directory=True)
        pairs += ["--bundle", str(dest), "--checkpoint", str(ckpts / fixture / "checkpoint")]
        out[fixture] = dest
    # One process for all of them (torch and transformers imported once); each bundle already
    # holding this version's envelope is skipped.
    subprocess.run([python, str(ROOT / "tools/refgen/envelope.py"), *pairs], check=True,
                   stdout=subprocess.DEVNULL)
    log(f"{len(out)} bundle(s) with their envelopes under {root}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", type=Path, default=ROOT / "build")
    ap.add_argument("--work", type=Path, default=ROOT / "var" / "mutations")
    ap.add_argument("--only", nargs="+", metavar="NAME")
    ap.add_argument("--classes", nargs="+", metavar="CLASS",
                    help="only the mutations of these classes (manifest \"class\")")
    ap.add_argument("--out", type=Path, help="also write the Markdown table here")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="per cell")
    ap.add_argument("--agents", type=int, default=2,
                    help="local agents, each building and running one cell at a time")
    ap.add_argument("--checkpoints", type=Path,
                    help="fixture folder to use (make_checkpoint.py --out-root; up-to-date "
                         "variants are kept); default: <work>/checkpoints")
    ap.add_argument("--variants", nargs="+", metavar="NAME",
                    help="correct variants to run (tools/variants/manifest.json), 'all' or "
                         "'none' (default: all, none with --only or --classes)")
    ap.add_argument("--envelopes-only", action="store_true",
                    help="only make the fixtures and their bundles with envelopes under "
                         "<work>/envelopes (every fixture of both manifests), then stop")
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
    if args.classes:
        mutations = [m for m in mutations if m.get("class", "classic") in args.classes]
    if args.check:
        return check_patches(mutations)
    variants = variant_suite.load()
    wanted = args.variants or (["none"] if args.only or args.classes else ["all"])
    if args.envelopes_only:
        wanted = ["all"]
    if wanted != ["all"]:
        unknown = set(wanted) - {v["name"] for v in variants} - {"none"}
        if unknown:
            ap.error(f"unknown variant(s) {sorted(unknown)}")
        variants = [v for v in variants if v["name"] in wanted]
    fixtures = sorted({m["fixture"] for m in mutations} |
                      {f for v in variants for f, _ in v["cells"]})
    controls = sorted({(lane_of(m), m["fixture"], m.get("precision", "fp32")) for m in mutations})
    sys.path.insert(0, str(ROOT / "tools" / "refgen"))
    from families import all_variants  # noqa: E402
    fixture_variants = all_variants()

    for exe in ("bin/gatehouse-controller", "bin/gatehouse-agent", "bin/gatehouse-worker",
                "sdk/GatehouseWorkerConfig.cmake"):
        if not args.envelopes_only and not (build / exe).exists():
            ap.error(f"{build / exe} missing: build gatehouse-controller gatehouse-agent gatehouse-worker")

    log(f"fixtures {fixtures}")
    ckpts = (args.checkpoints or work / "checkpoints").resolve()
    subprocess.run([python, str(ROOT / "tools/refgen/make_checkpoint.py"), "--out-root", str(ckpts),
                    "--only", *fixtures], check=True, stdout=subprocess.DEVNULL)
    references = prepare_references(python, ckpts, fixtures, work / "envelopes")
    if args.envelopes_only:
        return 0
    repos = {}
    lanes = {lane_of(m) for m in mutations} | {v["lane"] for v in variants if v["lane"] == "cpp"}
    for lane in sorted(lanes):
        repos[lane] = work / ("adapter" if lane == "cpp" else f"adapter-{lane}")
        of_lane = [m for m in mutations if lane_of(m) == lane]
        make_repo(repos[lane], of_lane, lane)
        log(f"repository {repos[lane]} (lane {lane}): main + {len(of_lane)} mutation branch(es)")
    if "cpp" in repos:
        variant_suite.add_cpp_branches(repos["cpp"], variants)
    if any(v["lane"] == "python" for v in variants):
        repos["variants-python"] = work / "adapter-variants-python"
        variant_suite.make_python_repo(repos["variants-python"], variants)
    log(f"{len(variants)} correct variant(s), "
        f"{sum(len(v['cells']) for v in variants)} cell(s) that must pass")

    for sub in ("gatehouse.db", "gatehouse.db-wal", "gatehouse.db-shm"):
        (work / sub).unlink(missing_ok=True)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    http_port, grpc_port = free_port(), free_port()
    import torch  # the venv's: its version is the runtime pin, its prefix the agent's
    torch_version = torch.__version__.split("+")[0]
    # Tokens as an operator makes them (only their hashes are stored): one for this script,
    # one for the agent, whose name the agent token must carry.
    ctl = [str(build / "bin/gatehouse-controller"), "--db", str(work / "gatehouse.db")]
    api_token = subprocess.run([*ctl, "tokens", "create", "--name", "mutations", "--scopes",
                                "read,submit"], check=True, capture_output=True, text=True).stdout.strip()
    agent_token = work / "agent.token"  # registers agents "mutation-agent" and "mutation-agent-*"
    agent_token.write_text(subprocess.run([*ctl, "tokens", "create", "--name", "mutation-agent",
                                           "--kind", "agent"], check=True, capture_output=True,
                                          text=True).stdout.strip() + "\n")
    agent_token.chmod(0o600)
    procs = []
    try:
        procs.append(subprocess.Popen(
            [str(build / "bin/gatehouse-controller"), "--db", str(work / "gatehouse.db"),
             "--http", f"127.0.0.1:{http_port}", "--grpc", f"127.0.0.1:{grpc_port}",
             "--mirror-dir", str(work / "mirrors"), "--web-dir", str(ROOT / "web"),
             "--torch-pin", torch_version],
            stdout=open(work / "logs/controller.out", "w"), stderr=open(work / "logs/controller.log", "w")))
        def start_agent(n):
            procs.append(subprocess.Popen(
                [str(build / "bin/gatehouse-agent"), "--controller", f"127.0.0.1:{grpc_port}",
                 "--name", f"mutation-agent-{n}", "--work-dir", str(work / f"agent-{n}"),
                 "--sdk-dir", str(build / "sdk"), "--cmake-prefix-path", torch.utils.cmake_prefix_path,
                 "--worker", str(build / "bin/gatehouse-worker"), "--torch-version", torch_version,
                 "--token-file", str(agent_token)],
                stdout=open(work / f"logs/agent-{n}.out", "w"),
                stderr=open(work / f"logs/agent-{n}.log", "w")))

        # Agent 1 alone first: its first build of main fills ccache (CCACHE_BASEDIR is the agent's
        # work dir, so objects are shared across agents), and the others start once it runs a cell
        # instead of compiling the same sources beside it on the same cores.
        start_agent(1)
        api = f"http://127.0.0.1:{http_port}/api/v1"
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=2)
                break
            except OSError:
                time.sleep(0.2)

        bodies = {}

        def submit(lane, branch, fixture, precision, phases=None):
            body = {"repository": str(repos[lane]), "branch": branch,
                    "model_family": fixture_variants[fixture].family,
                    "checkpoint": str(ckpts / fixture / "checkpoint"),
                    "reference": str(references[fixture]), "precision": precision}
            bodies[(branch, fixture, precision)] = dict(body)
            if phases:
                body["phases"] = phases
            code, resp = http("POST", f"{api}/cells", body, api_token)
            # 202: the controller is still digesting the checkpoint (protocols.md §1); the cell
            # id needs the digest, so the same body is posted again until it answers the cell.
            deadline = time.time() + args.timeout_s
            while code == 202 and time.time() < deadline:
                time.sleep(resp.get("retry_after_s", 1) if isinstance(resp, dict) else 1)
                code, resp = http("POST", f"{api}/cells", body, api_token)
            if code not in (200, 201):
                raise SystemExit(f"submit {branch} on {fixture}: HTTP {code} {resp}")
            return resp["id"]

        cells = {("control", lane, f, p): submit(lane, "main", f, p) for lane, f, p in controls}
        for m in mutations:
            cells[("mutation", m["name"])] = submit(lane_of(m), f"mut/{m['name']}", m["fixture"],
                                                    m.get("precision", "fp32"), m.get("phases"))
        for v in variants:
            repo = "cpp" if v["lane"] == "cpp" else "variants-python"
            for fixture, precision in v["cells"]:
                cells[("variant", v["name"], fixture, precision)] = submit(
                    repo, f"var/{v['name']}", fixture, precision)
        log(f"{len(cells)} cells submitted; {args.agents} agent(s) run them, one at a time each")
        if args.agents > 1:
            first_build_deadline, built = time.time() + args.timeout_s, False
            while time.time() < first_build_deadline and procs[1].poll() is None:
                code, listing = http("GET", f"{api}/cells?limit=500", token=api_token)
                if code == 200 and any(c.get("status") not in ("queued", "leased")
                                       for c in listing.get("cells", [])):
                    built = True
                    break
                time.sleep(2)
            for n in range(2, args.agents + 1):
                start_agent(n)
            log(f"agents 2..{args.agents} started: " +
                ("agent 1 built main" if built else
                 "agent 1 " + ("exited" if procs[1].poll() is not None else "still building") +
                 f" (see {work / 'logs/agent-1.log'})"))

        results, deadline = {}, time.time() + args.timeout_s * len(cells)
        while len(results) < len(cells) and time.time() < deadline:
            for key, cid in cells.items():
                if key in results:
                    continue
                code, cell = http("GET", f"{api}/cells/{cid}", token=api_token)
                if code == 200 and cell["status"] in FINAL:
                    results[key] = cell
                    log(f"{key[0]} {' '.join(key[1:])}: {cell['status']}")
            time.sleep(2)
        # The same verdicts as CI sees them through the CLI: a passed correct variant (exit 0,
        # "correct, not bit-exact" in its report) and a caught mutation (exit 1).
        cli_lines, cli_ok = [], True
        passed_variant = next((k for k in cells if k[0] == "variant" and k[3] == "fp32" and
                               results.get(k, {}).get("status") == "passed"), None)
        caught_mutation = next((m for m in mutations if not m.get("phases") and
                       results.get(("mutation", m["name"]), {}).get("status") == "failed"), None)
        if passed_variant and caught_mutation:
            v = next(v for v in variants if v["name"] == passed_variant[1])
            cli_lines, cli_ok = variant_suite.cli_round_trip(
                build / "bin/gatehouse", f"http://127.0.0.1:{http_port}", api_token,
                bodies[(f"var/{v['name']}", passed_variant[2], passed_variant[3])],
                bodies[(f"mut/{caught_mutation['name']}", caught_mutation["fixture"],
                        caught_mutation.get("precision", "fp32"))])
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
    for lane, f, p in controls:
        cell = results.get(("control", lane, f, p), {"status": "timeout"})
        ok = cell.get("status") == "passed"
        controls_ok &= ok
        control_rows.append(f"| {f} | {fixture_variants[f].family} ({lane}) | {p} | {cell.get('status')} |")
    by_class, let_through, unexplained = {}, [], []
    for m in mutations:
        cell = results.get(("mutation", m["name"]), {"status": "timeout", "phases": []})
        gate, figure, reason = verdict(cell)
        caught += gate is not None
        if gate is None and m.get("envelope_lets_through") and cell.get("status") == "passed":
            # A bug the envelope of correct implementations cannot tell from rounding (bf16 only):
            # named with each numeric figure against its bar, never silently.
            phases = {p["phase"]: p for p in cell.get("phases", [])}
            figs = "; ".join(f"{n}: {' '.join(variant_suite.phase_summary(phases[n])[1:])}"
                             for n in variant_suite.NUMERIC_PHASES if n in phases)
            let_through.append(f"| {m['name']} | {m['fixture']} {m.get('precision', 'fp32')} | "
                               f"{figs} | {m['envelope_lets_through']} |")
            gate = None
            figure, reason = "let through by the envelope (below)", ""
        elif gate is None:
            unexplained.append(m["name"])
        cls = m.get("class", "classic") + (f" ({lane_of(m)})" if lane_of(m) != "cpp" else "")
        tally = by_class.setdefault(cls, [0, 0])
        tally[0] += gate is not None
        tally[1] += 1
        rows.append(f"| {m['name']} | {cls} | {m['bug']} | {m['fixture']} "
                    f"{m.get('precision', 'fp32')} | {gate or 'SURVIVED'} | {figure} | "
                    f"{reason[:200].replace('|', '/')} |")
    score = 100.0 * caught / len(mutations) if mutations else 0.0
    variant_lines, false_fails, variant_cells = variant_suite.report(variants, results)
    text = "\n".join([
        "# Mutation suite",
        "",
        f"Produced by `tools/mutations/run_mutations.py` on {datetime.date.today().isoformat()}: each "
        "mutation is a committed patch (tools/mutations/) on its own branch of a real git repository, "
        "run end to end (controller, agent, worker) against a checkpoint transformers saved. "
        "A mutation whose manifest entry names phases runs only those (the `logprob` ones: every "
        "default phase but decode, which would catch a decode-path bug first; they show the "
        "logprob_parity gate catching it on its own, as in an RL team's "
        "cell with no upstream decode to compare with).",
        "",
        "Controls (main branch, unmutated adapter; each must pass):",
        "",
        "| fixture | family | precision | status |",
        "|---|---|---|---|",
        *control_rows,
        "",
        "| mutation | class | bug | fixture, precision | caught by gate | key figure | reason |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "By class: " + ", ".join(f"{c} {n}/{t}" for c, (n, t) in sorted(by_class.items())) + ".",
        "",
        f"Mutation score: {caught}/{len(mutations)} = {score:.0f} % caught; "
        f"{len(let_through)} let through by the envelope, each named below; "
        f"{len(unexplained)} survived unexplained; false FAILs: {false_fails} of {variant_cells} "
        "correct-variant cells.",
        "",
        *([] if not let_through else [
            "## Let through by the envelope",
            "",
            "Bugs whose effect is the size of the envelope of correct implementations in their "
            "precision: a correct bf16 implementation rounds as far (docs/bars.md, \"Margins\"). "
            "They exist only in bf16 (in fp32 the cast they drop is a no-op), so an fp32 cell "
            "cannot show them either; GET /api/v1/readiness tells that a bf16 cell's numerics "
            "need the fp32 cell.",
            "",
            "| mutation | fixture, precision | figures (bar) | why |",
            "|---|---|---|---|",
            *let_through,
            ""]),
        "",
        *(variant_lines if variants else []),
        *cli_lines,
    ])
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if controls_ok and not unexplained and false_fails == 0 and cli_ok else 1


if __name__ == "__main__":
    sys.exit(main())
