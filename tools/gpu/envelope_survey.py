#!/usr/bin/env python3
"""The envelope of correct implementations on many fixtures, on the CPU or a GPU: a table.

What
    For each fixture (a tools/refgen/families variant), makes the checkpoint and its CPU bundle
    with make_checkpoint.py, then measures the bundle's envelope (tools/refgen/envelope.py) on
    --device: on the CPU the fixture's own bundle gets it; on CUDA the reference runner makes a
    bundle on the GPU (reference_cell.py --device cuda, whose reference phase measures the
    envelope there). Prints, per fixture and precision, the envelope's prompt, decode-step and
    training figures and the variation each came from, and writes them as JSON.

    python tools/gpu/envelope_survey.py --out DIR [--device cpu|cuda] [--jobs N]
        [--only NAME ...] [--time-limit-s S]

    --jobs: fixtures made and measured at once (each process gets cores / jobs threads on the
    CPU). --time-limit-s: stop starting new fixtures after this long; what finished is kept.
    Writes DIR/envelopes.json ({fixture: reference.json "envelope"}) and DIR/envelopes.md.
"""

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "refgen"))


def one(name, out, device, threads, python):
    """Makes fixture `name` under out/fixtures and measures its envelope on `device`; returns
    (name, envelope or None, error text)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_CBWR="AUTO,STRICT",
               PYTHONUNBUFFERED="1")
    root = out / "fixtures"
    log = out / "logs" / f"{name}.log"
    with open(log, "w") as f:
        proc = subprocess.run([python, str(ROOT / "tools/refgen/make_checkpoint.py"),
                               "--out-root", str(root), "--only", name],
                              stdout=f, stderr=subprocess.STDOUT, env=env)
        if proc.returncode:
            return name, None, f"make_checkpoint exit {proc.returncode} (see {log})"
        ckpt = root / name / "checkpoint"
        if device == "cpu":
            bundle = root / name / "reference"
            cmd = [python, str(ROOT / "tools/refgen/envelope.py"), "--bundle", str(bundle),
                   "--checkpoint", str(ckpt)]
        else:
            bundle = out / "cuda" / name
            cmd = [python, str(ROOT / "tools/refgen/reference_cell.py"), "--checkpoint",
                   str(ckpt), "--out", str(bundle), "--device", "cuda"]
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        if proc.returncode:
            return name, None, f"{Path(cmd[1]).name} exit {proc.returncode} (see {log})"
    meta = json.loads((bundle / "reference.json").read_text())
    return name, meta.get("envelope"), ""


def table(envelopes):
    lines = ["| fixture | precision | prompt max abs (from) | KL | top-1 % | decode steps max abs "
             "(from) | top-1 % | grad norm rel (from) | grad sum rel | loss rel (max over steps) "
             "| seconds |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, env in sorted(envelopes.items()):
        for precision in ("fp32", "bf16"):
            e = env[precision]
            p, d, t = e["prompt"], e["decode_steps"], e["training"]
            lines.append(
                f"| {name} | {precision} | {p['max_abs_diff']:.3g} ({p['max_abs_diff_from']}) | "
                f"{p['kl_mean']:.3g} | {p['top1_percent']:.2f} | {d['max_abs_diff']:.3g} "
                f"({d['max_abs_diff_from']}) | {d['top1_percent']:.2f} | "
                f"{t['grad_norm_rel']:.3g} ({t['grad_norm_rel_from']}) | {t['grad_sum_rel']:.3g} | "
                f"{max(t['loss_rel']):.3g} | {env['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    from families import all_variants  # noqa: E402
    names = sorted(all_variants())
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--only", nargs="+", choices=names, metavar="NAME")
    ap.add_argument("--time-limit-s", type=float, default=1e9)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "logs").mkdir(exist_ok=True)
    threads = max(1, (os.cpu_count() or 2) // args.jobs)
    t0 = time.monotonic()
    envelopes, errors = {}, {}
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        pending = set()
        queue = list(args.only or names)
        while queue or pending:
            while queue and len(pending) < args.jobs and time.monotonic() - t0 < args.time_limit_s:
                pending.add(pool.submit(one, queue.pop(0), args.out, args.device, threads,
                                        sys.executable))
            if not pending:
                break
            done, pending = concurrent.futures.wait(pending, return_when="FIRST_COMPLETED")
            for fut in done:
                name, env, err = fut.result()
                if env is None:
                    errors[name] = err or "no envelope in the bundle"
                else:
                    envelopes[name] = env
                print(f"{name}: {'ok' if env else errors[name]} "
                      f"({time.monotonic() - t0:.0f} s)", flush=True)
        not_started = queue
    (args.out / "envelopes.json").write_text(json.dumps(
        {"device": args.device, "envelopes": envelopes, "errors": errors,
         "not_started": not_started}, indent=1) + "\n")
    text = table(envelopes) if envelopes else "no envelope measured\n"
    if errors:
        text += "\nerrors: " + json.dumps(errors) + "\n"
    if not_started:
        text += f"\nnot started (time limit): {', '.join(not_started)}\n"
    (args.out / "envelopes.md").write_text(text)
    print(text)
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
