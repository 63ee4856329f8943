#!/usr/bin/env python3
"""Runs the real gatehouse-worker over fixture variants and prints one table of the gates.

The prepared GPU check (gpu_check.sh) calls it with --device cuda --mode cuda_graph; on the CPU
(--device cpu --mode eager) it checks itself. Each run writes a run spec like the agent's
(docs/protocols.md §3; identity is left out: there is no checkout) and reads the worker's JSON
lines. Exit status 1 when any run did not end PASS.

  run_gates.py --build-dir build --testdata build/testdata --device cuda --mode cuda_graph \
      --precision bf16 fp32 --variant llama-tiny-untied:llama qwen3-tiny-untied:qwen3
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

PHASES = ["config", "construct", "load", "inference", "decode", "packing", "logprob_parity",
          "training", "save", "parallel", "cuda_graph", "performance"]
# Figures shown per phase (those the gate reported).
SHOWN = {
    "inference": ["kl_mean", "top1_agreement", "max_abs_diff", "bar_kl_mean", "bar_top1_agreement"],
    "decode": ["tokens_matched", "tokens_total", "steps_max_abs_diff", "steps_kl_mean",
               "steps_bar_kl_mean", "near_tie_divergences", "ms_per_token"],
    "packing": ["sequences_bit_equal", "max_abs_diff", "kl_max", "loss_rel_diff",
                "grad_rel_diff_max"],
    "logprob_parity": ["mean_abs_diff", "max_abs_diff", "k3_kl", "graph_mean_abs_diff",
                       "graph_max_abs_diff", "graph_k3_kl", "bar_mean_abs_diff"],
    "training": ["loss_step_1", "loss_rel_diff_step_1", "loss_rel_diff_step_2",
                 "grad_norm_max_rel_diff", "bar_grad_norm_rel", "step_ms"],
    "cuda_graph": ["tokens_matched", "tokens_total", "steps_max_abs_diff", "steps_kl_mean",
                   "eager_ms_per_token_b1", "graph_ms_per_token_b1", "speedup_b1", "speedup_b4",
                   "speedup_b16"],
    "performance": None,  # every figure
}


def run_spec(variant_dir, family, precision, device, mode, attempt_dir, tp):
    return {
        "spec_version": 1, "repository": "/dev/null", "commit": "0" * 40,
        "model_family": family,
        "checkpoint": {"path": os.path.join(variant_dir, "checkpoint"), "digest": "unchecked"},
        "reference": {"path": os.path.join(variant_dir, "reference"), "digest": "unchecked"},
        "runtime": {"torch": "2.11.0", "device": device},
        "launch": {"runner": "gatehouse-worker", "processes_per_rank": 1},
        "topology": {"tp": tp, "dp": 1, "pp": 1, "ep": 1},
        "precision": precision, "mode": mode,
        "decode": {"max_new_tokens": 32, "sampling": "greedy"},
        "training": {"steps": 2, "lr": 0.001, "seed": 1234},
        "env": {}, "phases": PHASES,
        "attempt": {"id": 1, "dir": attempt_dir,
                    "checkout": {"head": "0" * 40, "clean": True, "path": "/dev/null"},
                    "agent": "gpu-check"},
    }


def fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--testdata", required=True)
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--mode", default="cuda_graph", choices=["eager", "cuda_graph"])
    ap.add_argument("--precision", nargs="+", default=["bf16", "fp32"])
    ap.add_argument("--variant", nargs="+", required=True, help="VARIANT:FAMILY")
    ap.add_argument("--json", help="also write every run's events here")
    args = ap.parse_args()

    worker = os.path.abspath(os.path.join(args.build_dir, "bin", "gatehouse-worker"))
    plugin = os.path.abspath(os.path.join(args.build_dir, "lib", "libgatehouse_models.so"))
    rows, all_events, ok = [], {}, True
    for item in args.variant:
        variant, family = item.split(":")
        for precision in args.precision:
            with tempfile.TemporaryDirectory(prefix="gatehouse-gpu-") as tmp:
                spec = run_spec(os.path.abspath(os.path.join(args.testdata, variant)), family, precision,
                                args.device, args.mode, tmp, 1)
                spec_path = os.path.join(tmp, "run.json")
                with open(spec_path, "w") as f:
                    json.dump(spec, f)
                proc = subprocess.run([worker, "--run-spec", spec_path, "--plugin", plugin],
                                      capture_output=True, text=True)
            events = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
            all_events[f"{variant}/{precision}"] = events
            run_end = next((e["status"] for e in events if e["event"] == "run_end"), "NONE")
            ok &= run_end == "PASS"
            status = {e["phase"]: e for e in events if e["event"] == "phase_end"}
            figures = {}
            for e in events:
                if e["event"] == "figure":
                    figures.setdefault(e["phase"], {})[e["name"]] = e["value"]
            rows.append((variant, precision, run_end, status, figures, proc.stderr))

    for variant, precision, run_end, status, figures, stderr in rows:
        print(f"\n### {variant} {precision} ({args.device}, {args.mode}): run_end {run_end}\n")
        print("| phase | status | figures / reason |")
        print("|---|---|---|")
        for phase in PHASES:
            e = status.get(phase, {})
            shown = SHOWN.get(phase, [])
            f = figures.get(phase, {})
            names = list(f) if shown is None else [n for n in shown if n in f]
            text = ", ".join(f"{n} {fmt(f[n])}" for n in names)
            if e.get("status") not in (None, "PASS"):
                text = (text + "; " if text else "") + e.get("reason", "")
            print(f"| {phase} | {e.get('status', '-')} | {text} |")
        if run_end == "NONE":
            print("\nworker stderr (tail):\n" + stderr[-2000:])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(all_events, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
