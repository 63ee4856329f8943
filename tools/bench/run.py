#!/usr/bin/env python3
"""CPU benchmark: Gatehouse (gatehouse-bench) vs transformers (hf_peer.py), one table.

Makes a random Llama checkpoint with transformers' save_pretrained (once per shape, under
--work-dir), then runs, in alternating rounds on the same machine, the same checkpoint, the
same dtype, the same token ids and the same intra-op thread count (torch.set_num_threads on
both sides):
  gatehouse-bench             the Gatehouse llama family, reached through the worker SDK
  hf_peer.py --attn sdpa      transformers' default attention
  hf_peer.py --attn eager     transformers' eager attention (what the Gatehouse family mirrors)
Each side times forward (prefill) and one training step (forward + backward + AdamW step);
every timed repetition of every round is pooled and the median reported.
Ratio = transformers time / Gatehouse time, so > 1 means Gatehouse is faster.

Usage (from the repository root, after building gatehouse-bench and gatehouse_models):
  .venv/bin/python tools/bench/run.py --build-dir build [--dtypes fp32,bf16] [--json out.json]
  .venv/bin/python tools/bench/run.py --build-dir build --profile     # plus per-op self times
  .venv/bin/python tools/bench/run.py --tiny ...                      # seconds; smoke test
See tools/bench/README.md.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name: (checkpoint shape, run shape). The medium shape keeps a whole default run (fp32 and
# bf16, 2 rounds, 3 sides) to about 2-3 minutes on 2 cores.
SHAPES = {
    "medium": dict(hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
                   num_key_value_heads=4, intermediate_size=1408, vocab_size=8000,
                   max_position_embeddings=1024, batch=1, seq=256, warmup=2, reps=3),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                 max_position_embeddings=128, batch=1, seq=32, warmup=1, reps=2),
}
# How far the last training loss may differ between sides, relative (both sides run the same
# steps on the same data from the same weights; they differ only by kernel rounding).
LOSS_RTOL = {"fp32": 1e-4, "bf16": 2e-2}
CKPT_FORMAT = 1  # bump when make_checkpoint's output changes for the same shape


def make_checkpoint(shape: dict, out: Path) -> Path:
    """A random Llama checkpoint (untied, fp32, seed 0) written by save_pretrained; cached."""
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "intermediate_size", "vocab_size", "max_position_embeddings")
    cfg = {k: shape[k] for k in keys}
    stamp = json.dumps({"format": CKPT_FORMAT, "config": cfg,
                        "transformers": transformers.__version__}, sort_keys=True)
    if (out / ".done").is_file() and (out / ".done").read_text() == stamp:
        return out
    torch.manual_seed(0)
    config = LlamaConfig(**cfg, tie_word_embeddings=False, rms_norm_eps=1e-5)
    model = LlamaForCausalLM(config)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    (tmp / ".done").write_text(stamp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def run_json(cmd: list, env: dict) -> dict:
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        raise SystemExit(f"failed ({p.returncode}): {' '.join(map(str, cmd))}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def chrome_trace_self_ms(path: Path) -> dict:
    """{section: {op: self ms}} from gatehouse-bench's legacy-profiler Chrome trace.

    Self time = duration minus the durations of the events directly nested in it (same
    thread). Sections are the bench::forward and bench::train_step ranges; events of other
    threads (autograd's backward runs on a worker thread) are attributed to train_step."""
    data = json.loads(path.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    events = [e for e in events if e.get("ph") == "X"]
    by_tid = defaultdict(list)
    for e in events:
        by_tid[e.get("tid")].append(e)
    sections = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in events
                if e["name"] in ("bench::forward", "bench::train_step")}
    out = {"forward": defaultdict(float), "train_step": defaultdict(float)}
    for evs in by_tid.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []  # [event, child_us]
        finished = []
        for e in evs:
            while stack and e["ts"] >= stack[-1][0]["ts"] + stack[-1][0]["dur"]:
                finished.append(stack.pop())
            if stack:
                stack[-1][1] += e["dur"]
            stack.append([e, 0.0])
        finished.extend(stack)
        for e, child in finished:
            if e["name"].startswith("bench::"):
                continue
            section = "train_step"
            f0, f1 = sections.get("bench::forward", (0, -1))
            if f0 <= e["ts"] <= f1:
                section = "forward"
            out[section][e["name"]] += (e["dur"] - child) / 1000.0
    return out


def print_profile(gh: dict, hf: dict, label: str, top: int = 18) -> None:
    for section in ("forward", "train_step"):
        g, h = gh.get(section, {}), hf.get(section, {})
        print(f"\nper-op self time, one {section} ({label}), ms: gatehouse vs {label}")
        names = sorted(set(g) | set(h), key=lambda n: -max(g.get(n, 0), h.get(n, 0)))[:top]
        print(f"  {'op':<44}{'gatehouse':>11}{label:>16}")
        for n in names:
            print(f"  {n[:43]:<44}{g.get(n, 0.0):>11.2f}{h.get(n, 0.0):>16.2f}")
        print(f"  {'total':<44}{sum(g.values()):>11.2f}{sum(h.values()):>16.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", type=Path, default=Path("build"),
                    help="build tree holding bin/gatehouse-bench and lib/libgatehouse_models.so")
    ap.add_argument("--bench-bin", type=Path, help="gatehouse-bench (default: BUILD/bin/...)")
    ap.add_argument("--plugin", type=Path, help="model plugin (default: BUILD/lib/...)")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/gatehouse-bench"),
                    help="where the random checkpoint (and profile files) go")
    ap.add_argument("--checkpoint", type=Path, help="use this HF llama checkpoint instead")
    ap.add_argument("--tiny", action="store_true", help="tiny shape, 1 round, fp32 (smoke test)")
    ap.add_argument("--dtypes", default=None, help="comma list of fp32,bf16 (default both)")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads on both sides")
    ap.add_argument("--seq", type=int, help="override the sequence length")
    ap.add_argument("--batch", type=int, help="override the batch size")
    ap.add_argument("--reps", type=int, help="override timed repetitions per round")
    ap.add_argument("--warmup", type=int, help="override warm-up iterations per measurement")
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 4)")
    ap.add_argument("--attn", default="sdpa,eager", help="transformers attention impls")
    ap.add_argument("--profile", action="store_true", help="also print per-op self times")
    ap.add_argument("--metric", choices=["wall", "cpu"], default="wall",
                    help="time per repetition: wall clock (default), or process CPU time, "
                         "which other load barely changes at --threads 1")
    ap.add_argument("--min-cpu-share", type=float, default=0.9,
                    help="warn when a side got less than this share of its CPUs")
    ap.add_argument("--json", type=Path, help="write all results as JSON to this file")
    a = ap.parse_args()

    shape = dict(SHAPES["tiny" if a.tiny else "medium"])
    for k in ("seq", "batch", "reps", "warmup"):
        if getattr(a, k) is not None:
            shape[k] = getattr(a, k)
    dtypes = (a.dtypes or ("fp32" if a.tiny else "fp32,bf16")).split(",")
    rounds = a.rounds if a.rounds is not None else (1 if a.tiny else 4)
    attns = [x for x in a.attn.split(",") if x]
    bench_bin = a.bench_bin or a.build_dir / "bin" / "gatehouse-bench"
    plugin = a.plugin or a.build_dir / "lib" / "libgatehouse_models.so"
    for p in (bench_bin, plugin):
        if not p.exists():
            raise SystemExit(f"{p} not found: build gatehouse-bench and gatehouse_models first")
    a.work_dir.mkdir(parents=True, exist_ok=True)
    ckpt = a.checkpoint or make_checkpoint(
        shape, a.work_dir / ("llama-bench-tiny" if a.tiny else "llama-bench-medium"))
    cfg = json.loads((ckpt / "config.json").read_text())

    # Same intra-op thread count on both sides: each sets it explicitly; OMP/MKL env vars are
    # pinned too so neither side's runtime starts more threads than the other.
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    common = ["--checkpoint", str(ckpt), "--batch", str(shape["batch"]), "--seq",
              str(shape["seq"]), "--threads", str(a.threads), "--warmup", str(shape["warmup"]),
              "--reps", str(shape["reps"])]
    sides = [("gatehouse", None)] + [(f"transformers[{x}]", x) for x in attns]
    runs = defaultdict(list)  # (dtype, side) -> [result per round]
    profiles = {}
    for r in range(rounds):
        for dtype in dtypes:
            for side, attn in sides:
                last = r == rounds - 1 and a.profile
                if attn is None:
                    cmd = [str(bench_bin), "--plugin", str(plugin), "--dtype", dtype, *common]
                    trace = a.work_dir / f"gatehouse-{dtype}.trace.json"
                    if last:
                        cmd += ["--profile-trace", str(trace)]
                    runs[(dtype, side)].append(run_json(cmd, env))
                    if last:
                        profiles[(dtype, side)] = chrome_trace_self_ms(trace)
                else:
                    ops = a.work_dir / f"hf-{attn}-{dtype}.ops.json"
                    cmd = [sys.executable, str(HERE / "hf_peer.py"), "--attn", attn, "--dtype",
                           dtype, *common]
                    if last:
                        cmd += ["--profile-ops", str(ops)]
                    runs[(dtype, side)].append(run_json(cmd, env))
                    if last:
                        profiles[(dtype, side)] = json.loads(ops.read_text())

    def metric_key(key):
        return key.replace("_ms", "_cpu_ms") if a.metric == "cpu" else key

    def pooled(dtype, side, key):
        return [x for res in runs[(dtype, side)] for x in res[metric_key(key)]]

    def paired_ratios(dtype, side, key):
        """Per round: transformers median / Gatehouse median of that round's repetitions. The
        sides of one round run back to back, so a slow phase of the machine that spans a round
        moves both; the median over rounds is the reported ratio."""
        k = metric_key(key)
        return [statistics.median(hf[k]) / statistics.median(gh[k])
                for gh, hf in zip(runs[(dtype, "gatehouse")], runs[(dtype, side)])]

    first = runs[(dtypes[0], sides[1][0])][0] if len(sides) > 1 else runs[(dtypes[0], "gatehouse")][0]
    print(f"Gatehouse vs transformers {first.get('transformers', '?')}, torch {first['torch']}, CPU, "
          f"{a.threads} intra-op threads on both sides (torch.set_num_threads)")
    print(f"checkpoint {ckpt}: {cfg['model_type']} hidden {cfg['hidden_size']}, "
          f"{cfg['num_hidden_layers']} layers, heads {cfg['num_attention_heads']}/"
          f"{cfg['num_key_value_heads']} kv, intermediate {cfg['intermediate_size']}, "
          f"vocab {cfg['vocab_size']}")
    print(f"B={shape['batch']} T={shape['seq']} (train step on T-1 inputs); times: median of "
          f"{shape['reps']} reps x {rounds} round(s), {shape['warmup']} warm-up each; {a.metric} time; "
          f"ratio = transformers time / Gatehouse time (>1: Gatehouse faster), median over rounds "
          f"of each round's paired ratio [lowest-highest round]\n")
    head = f"{'dtype':<6}{'measure':<20}{'gatehouse':>16}"
    for side, _ in sides[1:]:
        head += f"{side:>24}{'ratio [range]':>22}"
    print(head)
    table = []
    for dtype in dtypes:
        for key, label, unit in (("forward_ms", "forward (prefill)", "tok/s"),
                                 ("train_step_ms", "train step", "ms")):
            gh = statistics.median(pooled(dtype, "gatehouse", key))
            toks = shape["batch"] * (shape["seq"] if key == "forward_ms" else shape["seq"] - 1)

            def show(ms):
                return f"{1000.0 * toks / ms:.0f} {unit}" if unit == "tok/s" else f"{ms:.1f} {unit}"

            line = f"{dtype:<6}{label:<20}{show(gh):>16}"
            row = {"dtype": dtype, "measure": label, "gatehouse_ms": gh, "tokens": toks}
            for side, _ in sides[1:]:
                hf = statistics.median(pooled(dtype, side, key))
                per_round = paired_ratios(dtype, side, key)
                ratio = statistics.median(per_round)
                line += f"{show(hf):>24}{ratio:>7.2f}x [{min(per_round):.2f}-{max(per_round):.2f}]"
                row[side + "_ms"] = hf
                row[side + "_ratio"] = ratio
                row[side + "_ratio_per_round"] = per_round
            print(line)
            table.append(row)
    print()
    shares = []
    for dtype in dtypes:
        for side, _ in sides:
            for key in ("forward_cpu_share", "train_step_cpu_share"):
                shares.append((min(res[key] for res in runs[(dtype, side)]), dtype, side, key))
    worst = min(shares)
    print(f"cpu share (process CPU time / (wall time x threads); about 1.0 when undisturbed): "
          f"lowest {worst[0]:.2f} ({worst[2]} {worst[1]} {worst[3].replace('_cpu_share', '')})")
    if worst[0] < a.min_cpu_share and a.metric == "wall":
        print(f"WARNING: below {a.min_cpu_share}: other processes took the CPUs during the run; "
              f"these timings are not reliable, run again on a quiet machine")
    mismatch = False
    for dtype in dtypes:
        losses = [runs[(dtype, side)][-1]["last_loss"] for side, _ in sides]
        shown = ", ".join(f"{side} {x:.6f}" for (side, _), x in zip(sides, losses))
        steps = shape["warmup"] + shape["reps"]
        spread = (max(losses) - min(losses)) / max(abs(losses[0]), 1e-12)
        ok = spread <= LOSS_RTOL[dtype]
        mismatch |= not ok
        print(f"sanity ({dtype}): loss after {steps} identical training steps: {shown}: "
              + ("agree" if ok else f"LOSS MISMATCH (relative spread {spread:.2e} > "
                                    f"{LOSS_RTOL[dtype]:.0e}): the sides do not compute the same"))

    if a.profile:
        for dtype in dtypes:
            for side, _ in sides[1:]:
                print_profile(profiles[(dtype, "gatehouse")], profiles[(dtype, side)],
                              f"{side} {dtype}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({
            "threads": a.threads, "metric": a.metric, "shape": shape, "rounds": rounds, "checkpoint": str(ckpt),
            "config": cfg, "table": table,
            "runs": {f"{d}/{s}": v for (d, s), v in runs.items()},
            "profiles": {f"{d}/{s}": v for (d, s), v in profiles.items()},
        }, indent=1) + "\n")
        print(f"\nwrote {a.json}")
    return 1 if mismatch else 0


if __name__ == "__main__":
    sys.exit(main())
