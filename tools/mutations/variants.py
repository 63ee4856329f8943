"""The false-FAIL suite beside the mutation suite: correct implementations that must PASS.

A correct adaptation computes upstream's function in its own order of floating-point
operations, as the frameworks our users ship do (torchtitan's complex RoPE and SDPA, AReaL
Archon's own RoPE and attention, fused projections, upstream's own class on another attention
backend). tools/variants/manifest.json lists such variants; each is run end to end like a
mutation (its own branch of a real repository, a real controller, agent and worker) on the
fixtures and precisions it names, and every one of those cells must PASS: a FAIL is a false
FAIL, a gate holding a correct adapter to a bar it cannot meet.

Manifest entries:
  {"name", "lane": "cpp" | "python", "what": one line,
   "patch": "cpp/<file>.patch"            (cpp: applied to models/, like a mutation)
   "source": "python", "entries": [...]   (python: tools/variants/<source> is the repository,
                                           its recipe naming these SPEC entries)
   "cells": [[fixture, precision], ...]}
"""

import json
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ROOT / "tools" / "variants"
NUMERIC_PHASES = ("inference", "decode", "training")
GENERATED = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")


def load():
    """The manifest's variants, each with its cells as (fixture, precision) tuples."""
    variants = json.loads((VARIANTS / "manifest.json").read_text())["variants"]
    for v in variants:
        v["cells"] = [tuple(c) for c in v["cells"]]
    return variants


def git(repo, *args):
    """git -C repo ARGS with a committer of its own; errors raise with git's stderr."""
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=gatehouse-mutations",
                    "-c", "user.email=mutations@gatehouse.invalid", *args],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def add_cpp_branches(repo, variants):
    """A branch var/<name> of the C++ repository (main: models/) per cpp variant, its patch
    applied and committed."""
    for v in variants:
        if v["lane"] != "cpp":
            continue
        git(repo, "checkout", "-q", "-b", f"var/{v['name']}", "main")
        try:
            git(repo, "apply", "--index", str(VARIANTS / v["patch"]))
        except subprocess.CalledProcessError as e:
            raise SystemExit(f"variant {v['name']}: {v['patch']} does not apply to models/: "
                             f"{e.stderr.decode(errors='replace').strip()}")
        git(repo, "commit", "-q", "-m", f"variant {v['name']}: {v['what']}")
        git(repo, "checkout", "-q", "main")


def make_python_repo(repo, variants):
    """The variants' Python source (tools/variants/python) as a repository: main holds it, and
    branch var/<name> adds a recipe naming that variant's SPEC entries (two adapters for one
    model_type cannot share a recipe)."""
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(VARIANTS / "python", repo, ignore=GENERATED)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "correct variants (false-FAIL suite)")
    for v in variants:
        if v["lane"] != "python":
            continue
        git(repo, "checkout", "-q", "-b", f"var/{v['name']}", "main")
        recipe = {"recipe_version": 1, "lane": "python",
                  "build": {"system": "pip", "source_dir": "."}, "entries": v["entries"]}
        (repo / "gatehouse.recipe.json").write_text(json.dumps(recipe, indent=1) + "\n")
        git(repo, "add", "gatehouse.recipe.json")
        git(repo, "commit", "-q", "-m", f"variant {v['name']}: {v['what']}")
        git(repo, "checkout", "-q", "main")


def check_patches():
    """git apply --check of every cpp variant's patch against a copy of models/; the names of
    those that no longer apply."""
    import tempfile
    bad = []
    with tempfile.TemporaryDirectory(prefix="gh-varcheck-") as tmp:
        shutil.copytree(ROOT / "models", Path(tmp) / "models", ignore=GENERATED)
        for v in load():
            if v["lane"] != "cpp":
                continue
            proc = subprocess.run(["git", "apply", "--check", str(VARIANTS / v["patch"])],
                                  cwd=Path(tmp) / "models", capture_output=True, text=True)
            print(f"{'ok  ' if proc.returncode == 0 else 'FAIL'} variant {v['name']} ({v['patch']})"
                  + (f": {proc.stderr.strip()}" if proc.returncode else ""))
            if proc.returncode:
                bad.append(v["name"])
    return bad


def _figures(phase):
    return {f["name"]: f["value"] for f in phase.get("figures", [])}


def _num(v, spec=".3g"):
    try:
        return format(float(v), spec)
    except (TypeError, ValueError):
        return str(v)


def phase_summary(phase):
    """One phase's claim and its main figure against its bar."""
    f = _figures(phase)
    claim = f.get("claim", "-")
    name = phase["phase"]
    if name == "inference" and "max_abs_diff" in f:
        figure = (f"max abs {_num(f['max_abs_diff'])} (bar {_num(f.get('bar_max_abs_diff'))}), "
                  f"KL {_num(f.get('kl_mean'))} (bar {_num(f.get('bar_kl_mean'))}), top-1 "
                  f"{_num(f.get('top1_agreement'), '.1f')} % (bar {_num(f.get('bar_top1_agreement'), '.1f')})")
    elif name == "decode" and "steps_max_abs_diff" in f:
        figure = (f"{f.get('tokens_matched')}/{f.get('tokens_total')} ids, steps max abs "
                  f"{_num(f['steps_max_abs_diff'])} (bar {_num(f.get('steps_bar_max_abs_diff'))}); "
                  f"vs continuation {_num(f.get('continuation_max_abs_diff'))} (bar "
                  f"{_num(f.get('continuation_bar_max_abs_diff'))})")
    elif name == "training" and "grad_norm_max_rel_diff" in f:
        figure = (f"grad norm {_num(f['grad_norm_max_rel_diff'])} (bar "
                  f"{_num(f.get('bar_grad_norm_rel'))}), step-2 loss "
                  f"{_num(f.get('loss_rel_diff_step_2'))} (bar {_num(f.get('bar_loss_rel'))})")
    else:
        figure = "-"
    return claim, figure


def report(variants, results):
    """(Markdown lines, false FAILs, cells) of the variants' cells; results maps
    ("variant", name, fixture, precision) to the cell JSON."""
    rows, false_fails, total = [], 0, 0
    for v in variants:
        for fixture, precision in v["cells"]:
            total += 1
            cell = results.get(("variant", v["name"], fixture, precision),
                               {"status": "timeout", "phases": []})
            status = cell.get("status")
            if status != "passed":
                false_fails += 1
            phases = {p["phase"]: p for p in cell.get("phases", [])}
            parts = []
            for name in NUMERIC_PHASES:
                if name in phases:
                    claim, figure = phase_summary(phases[name])
                    parts.append(f"{name}: {claim}; {figure}")
            failed = next((p for p in cell.get("phases", []) if p["status"] != "PASS"
                           and p["status"] != "SKIPPED"), None)
            reason = ""
            if status != "passed":
                reason = (f"{failed['phase']} {failed['status']}: {failed.get('reason', '')}"
                          if failed else cell.get("reason", ""))
            rows.append(f"| {v['name']} | {v['lane']} | {v['what']} | {fixture} {precision} | "
                        f"{status} | {' <br> '.join(parts) or '-'} | "
                        f"{reason[:200].replace('|', '/')} |")
    lines = [
        "## False-FAIL suite",
        "",
        "Correct implementations written the way our users' frameworks write them "
        "(tools/variants/manifest.json); every cell must PASS. The claim per numeric phase says "
        "whether it was bit-exact or correct within the envelope's bars.",
        "",
        "| variant | lane | what | fixture, precision | status | claims and figures (bar) | reason |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"False FAILs: {false_fails} of {total} correct-variant cells.",
        "",
    ]
    return lines, false_fails, total


def cli_round_trip(gatehouse, url, token, variant_body, mutation_body):
    """What a CI job sees through the `gatehouse` CLI (docs/cli.md) for one correct variant
    and one mutation, both already run: `submit --wait` of the same inputs answers the existing
    cell with exit 0 for the variant (PASS) and 1 for the mutation (a gate FAILed), and the
    variant's `report` says "correct, not bit-exact". Returns (Markdown lines, ok)."""
    env = dict(__import__("os").environ, GATEHOUSE_URL=url, GATEHOUSE_TOKEN=token)

    def submit(body):
        args = [str(gatehouse), "submit", "--repository", body["repository"], "--branch",
                body["branch"], "--family", body["model_family"], "--checkpoint",
                body["checkpoint"], "--reference", body["reference"], "--precision",
                body["precision"], "--wait", "--timeout-s", "600"]
        return subprocess.run(args, capture_output=True, text=True, env=env, timeout=700)

    lines, ok = ["### Through the CLI", ""], True
    var = submit(variant_body)
    cell = var.stdout.split()[0] if var.stdout.split() else ""
    report = subprocess.run([str(gatehouse), "report", cell], capture_output=True, text=True,
                            env=env, timeout=60) if cell else None
    claims = [l for l in (report.stdout.splitlines() if report else []) if l.startswith("| numerics |")]
    var_ok = var.returncode == 0 and bool(claims) and "correct, not bit-exact" in claims[0]
    ok &= var_ok
    lines.append(f"- `gatehouse submit --wait` of the correct variant on branch "
                 f"{variant_body['branch']} ({variant_body['precision']}): exit {var.returncode} "
                 f"({'expected 0' if var.returncode == 0 else 'EXPECTED 0'}); its report's "
                 f"evidence summary: `{claims[0] if claims else 'no numerics row'}`")
    mut = submit(mutation_body)
    ok &= mut.returncode == 1
    lines.append(f"- `gatehouse submit --wait` of the mutation on branch {mutation_body['branch']}: "
                 f"exit {mut.returncode} ({'expected 1: a gate FAILed' if mut.returncode == 1 else 'EXPECTED 1'})")
    if not ok:
        lines.append(f"- CLI output: {var.stdout.strip()} {var.stderr.strip()[-300:]} / "
                     f"{mut.stdout.strip()} {mut.stderr.strip()[-300:]}")
    lines.append("")
    return lines, ok

