#!/usr/bin/env python3
"""Time and memory per parallel layout against the single-rank control, on one checkpoint.

What
    Runs the parallel gate's training (the C++ lane's own plans: data parallelism, dp_shard's
    sharded optimizer state, tensor, pipeline and context parallelism, their combinations) in
    the worker's measure-only mode (``gatehouse-worker --parallel-measure-only``): each layout
    trains the gate's two AdamW steps of the same global batch with no single-rank control
    beside it and nothing compared, so four fp32 replicas of a real-size model fit on one
    machine. The control is the same code at world size 1: the whole model trained alone. For
    each layout it prints, against the control measured in the same run:

    - per rank, the peak resident set the layout itself needs (``peak_rss_bytes`` less
      ``rss_layout_start_bytes``: the gate releases the model the earlier phases loaded and
      reads the reference before it starts), the largest and smallest rank, and the ratio of
      the largest to the control's;
    - the parameter and optimizer-state elements the rank holds;
    - the wall time of step 2 (step 1 includes first-touch allocations), the slowest rank;
    - step 1's global loss against the control's (the same computation: equal, or within the
      reduction-order spread);

    so a layout that shards shows by how much it cuts per-rank memory, and one that does not
    (every rank holding the whole model) shows that too.

CLI
    .venv/bin/python tools/bench/parallel_layouts.py [--build-dir build] [--work-dir var/bench-parallel]
        [--checkpoint DIR --family qwen2] [--layouts "dp=2;tp=2;..."] [--threads-per-rank N]
        [--json out.json] [--tiny]

    Without --checkpoint it makes the random Qwen2.5-0.5B checkpoint real_size.py makes (cached
    under var/bench-real). The reference bundle (the global batch: --prompts sequences of
    --prompt-tokens random ids) is made once per checkpoint by the reference runner.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
import real_size  # noqa: E402  (the checkpoint maker)

# The layouts the gate has a check for, at 2 and 4 ranks (docs/parity.md's table), that a
# 14-head / 2-kv-head model (Qwen2.5-0.5B) takes: tp must divide both head counts.
DEFAULT_LAYOUTS = ["dp=2", "dp_shard=2", "tp=2", "pp=2", "cp=2",
                   "dp=2,tp=2", "dp_shard=2,tp=2", "pp=2,tp=2", "pp=4"]


def parse_layout(text):
    """'dp=2,tp=2' -> {'dp': 2, 'tp': 2}; the world size is their product."""
    out = {}
    for part in filter(None, text.replace(" ", "").split(",")):
        name, _, value = part.partition("=")
        if name not in ("dp", "dp_shard", "tp", "pp", "cp", "ep") or not value.isdigit() or int(value) < 1:
            raise SystemExit(f"--layouts: cannot read {part!r} (name=N with name one of dp, "
                             "dp_shard, tp, pp, cp, ep)")
        if name in out:
            raise SystemExit(f"--layouts: {name} given twice in {text!r}")
        out[name] = int(value)
    if not out:
        raise SystemExit("--layouts: an empty layout (give name=N[,name=N] per layout)")
    return out


def world_of(layout):
    n = 1
    for name, size in layout.items():
        if name != "ep":  # ep borrows its ranks
            n *= size
    return n


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_bundle(work_dir, checkpoint, python, prompts, tokens, vocab):
    """The reference bundle of `prompts` random sequences of `tokens` ids (seed 0), made once per
    (checkpoint, prompts, tokens) by the reference runner in person mode (one training step, one
    new token, no envelope: the parallel gate reads only the prompts)."""
    stamp = json.dumps({"checkpoint": str(checkpoint.resolve()), "prompts": prompts,
                        "tokens": tokens, "mtime": (checkpoint / "config.json").stat().st_mtime})
    out = work_dir / "reference"
    stamp_file = work_dir / "reference.stamp"
    if out.is_dir() and stamp_file.is_file() and stamp_file.read_text() == stamp:
        return out
    import random
    rng = random.Random(0)
    ids = [{"ids": [rng.randrange(min(1000, vocab // 2), vocab) for _ in range(tokens)]}
           for _ in range(prompts)]
    (work_dir / "prompts.json").write_text(json.dumps(ids))
    subprocess.run(["rm", "-rf", str(out)], check=True)
    print(f"[parallel_layouts] reference bundle: {prompts} x {tokens} tokens", file=sys.stderr)
    p = subprocess.run([python, str(ROOT / "tools" / "refgen" / "reference_cell.py"),
                        "--checkpoint", str(checkpoint), "--out", str(out),
                        "--prompts", str(work_dir / "prompts.json"), "--max-new-tokens", "1",
                        "--train-steps", "1", "--no-envelope"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-4000:])
        raise SystemExit("the reference runner failed")
    stamp_file.write_text(stamp)
    return out


def run_spec(checkpoint, bundle, family, precision, layout, attempt_dir):
    topology = {"tp": 1, "dp": 1, "pp": 1, "ep": 1}
    topology.update(layout)
    return {
        "spec_version": 1, "repository": str(ROOT), "commit": "0" * 40,
        "model_family": family,
        "checkpoint": {"path": str(checkpoint), "digest": "unchecked"},
        "reference": {"path": str(bundle), "digest": "unchecked"},
        "runtime": {"torch": "2.11.0", "device": "cpu"},
        "launch": {"runner": "gatehouse-worker", "processes_per_rank": 1},
        "topology": topology, "precision": precision, "mode": "eager",
        "decode": {"max_new_tokens": 1, "sampling": "greedy"},
        "training": {"steps": 2, "lr": 0.001, "seed": 1234},
        "env": {}, "phases": ["config", "construct", "load", "parallel"],
        "attempt": {"id": 1, "dir": str(attempt_dir),
                    "checkout": {"head": "0" * 40, "clean": True, "path": str(ROOT)},
                    "agent": "parallel-layouts-bench"},
    }


def run_layout(worker, lane_args, spec, world, threads, timeout_s):
    """Starts `world` worker ranks (torchrun's variables) and returns, per rank, the parallel
    phase's figures, status and reason."""
    attempt = Path(spec["attempt"]["dir"])
    attempt.mkdir(parents=True, exist_ok=True)
    (attempt / "run.json").write_text(json.dumps(spec))
    env = dict(os.environ, WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), OMP_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads), GATEHOUSE_GROUP_TIMEOUT_S=str(timeout_s))
    procs = []
    for r in range(world):
        out = open(attempt / f"events{r}.jsonl", "w")
        err = open(attempt / f"log{r}.txt", "w")
        procs.append(subprocess.Popen(
            [str(worker), "--run-spec", str(attempt / "run.json"), *lane_args,
             "--parallel-measure-only"],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=out, stderr=err))
    deadline = time.monotonic() + timeout_s
    timed_out = False
    for p in procs:
        try:
            p.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            for q in procs:
                q.kill()
                q.wait()
            break
    if timed_out:  # this layout's row says so; the others are still measured
        return [{"figures": {}, "status": "TIMEOUT",
                 "reason": f"ranks still running after {timeout_s} s (logs: {attempt})"}]
    ranks = []
    for r in range(world):
        rank = {"figures": {}, "status": None, "reason": ""}
        ends = {}  # phase -> its phase_end
        for line in (attempt / f"events{r}.jsonl").read_text().splitlines():
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            if ev.get("event") == "phase_end":
                ends[ev.get("phase")] = ev
            if ev.get("phase") != "parallel":
                continue
            if ev.get("event") == "figure":
                rank["figures"][ev["name"]] = ev["value"]
            elif ev.get("event") == "phase_end":
                rank["status"], rank["reason"] = ev["status"], ev.get("reason", "")
        # "skipped: earlier phase config ended BLOCKED": that phase's reason says why.
        for phase, end in ends.items():
            if phase != "parallel" and end.get("status") in ("FAIL", "BLOCKED", "UNKNOWN"):
                rank["reason"] += f" ({phase}: {end.get('reason', '')})"
                break
        rank["exit_code"] = procs[r].returncode
        if rank["status"] is None:
            # No parallel phase: the worker stopped before it (its log says why).
            log = (attempt / f"log{r}.txt").read_text(errors="replace").strip().splitlines()
            rank["status"] = f"rank {r} exited with code {procs[r].returncode} before the parallel phase"
            rank["reason"] = log[-1] if log else "(empty log)"
        ranks.append(rank)
    return ranks


def summarize(label, ranks):
    """One row's figures from the ranks' (None when a rank did not measure)."""
    if any(r["status"] != "SKIPPED" or "measured only" not in r["reason"] for r in ranks):
        bad = next(r for r in ranks if r["status"] != "SKIPPED" or "measured only" not in r["reason"])
        return {"layout": label, "error": f"{bad['status']}: {bad['reason'][:300]}"}
    own = [r["figures"]["peak_rss_bytes"] - r["figures"]["rss_layout_start_bytes"] for r in ranks]
    f0 = ranks[0]["figures"]
    steps = sorted(int(k.split("_")[2]) for k in f0 if k.startswith("measured_step_"))
    last = steps[-1]
    return {
        "layout": label, "ranks": len(ranks),
        "own_peak_bytes": own, "own_peak_max": max(own), "own_peak_min": min(own),
        "params_held": [r["figures"].get("parameter_elements_held") for r in ranks],
        "optimizer_state": [r["figures"].get("optimizer_state_elements") for r in ranks],
        "step_ms": {k: max(r["figures"][f"measured_step_{k}_ms"] for r in ranks) for k in steps},
        "timed_step": last,
        "loss_step_1": f0.get("loss_step_1"),
        "batch_tokens": f0.get("global_batch_tokens"),
        "batch_sequences": f0.get("global_batch_sequences"),
        "loss_step_2": f0.get("loss_step_2"),
    }


def gb(n):
    return f"{n / 1e9:.2f}"


def print_table(rows, control, meta):
    print(f"# Parallel layouts against the single-rank control: {meta['checkpoint_name']}, {meta['lane']}, "
          f"{meta['precision']}, gloo on CPU, {meta['cores']} cores, {meta['threads']} thread(s) "
          f"per rank (the control: {meta['control_threads']})\n")
    print(f"Global batch: {meta['prompts']} sequences of {meta['tokens']} tokens "
          f"({control['batch_tokens']} predicted), 2 AdamW steps; a layout whose check cuts or "
          "trims it (each data-parallel rank a sequence, 4 microbatches, cp dividing each "
          "packing) trains another batch, shown in 'batch tokens', and its loss is not compared. "
          "Own peak: the rank's peak resident set above what it held when the layout started "
          "(the loaded model released, the reference read). Step: the slowest rank's wall time "
          f"of step {control['timed_step']}.\n")
    print("| layout | ranks | own peak per rank GB (max / min) | max vs control | parameters held "
          "per rank (max) vs control | optimizer state per rank (max) vs control | step ms | "
          "vs control | batch tokens | loss step 1 rel. diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    cp = control["params_held"][0]
    co = control["optimizer_state"][0]
    cs = control["step_ms"][control["timed_step"]]
    for row in [control] + rows:
        if "error" in row:
            print(f"| {row['layout']} | | not measured: {row['error']} | | | | | | | |")
            continue
        ph = max(row["params_held"])
        os_ = max((n for n in row["optimizer_state"] if n is not None), default=0)
        st = row["step_ms"][row["timed_step"]]
        rel = (f"{loss_rel_diff(row, control):.1e}" if same_batch(row, control)
               else "another batch")
        print(f"| {row['layout']} | {row['ranks']} | {gb(row['own_peak_max'])} / "
              f"{gb(row['own_peak_min'])} | {row['own_peak_max'] / control['own_peak_max']:.2f} | "
              f"{ph:,} ({ph / cp:.2f}) | {os_:,} ({os_ / co:.2f}) | {st:.0f} | {st / cs:.2f} | "
              f"{row['batch_tokens']} | {rel} |")


def same_batch(row, control):
    """Whether the layout trained the control's batch (its check did not cut or trim it)."""
    return (row["batch_tokens"], row["batch_sequences"]) == (control["batch_tokens"],
                                                              control["batch_sequences"])


def loss_rel_diff(row, control):
    return abs(row["loss_step_1"] - control["loss_step_1"]) / abs(control["loss_step_1"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", type=Path, default=ROOT / "build")
    ap.add_argument("--work-dir", type=Path, default=ROOT / "var" / "bench-parallel")
    ap.add_argument("--checkpoint", type=Path, help="an HF checkpoint folder (default: the "
                    "random Qwen2.5-0.5B of real_size.py)")
    ap.add_argument("--checkpoints-dir", type=Path, default=ROOT / "var" / "bench-real",
                    help="where the made checkpoint is cached (real_size.py's, by default)")
    ap.add_argument("--family", default="qwen2")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--python-entry", help="run the Python lane with this adapter "
                    "(package.module:SPEC, e.g. gh_archon.llama.spec:SPEC) instead of the plugin")
    ap.add_argument("--layouts", default=";".join(DEFAULT_LAYOUTS),
                    help="';'-separated, each 'dim=N[,dim=N]' (default: %(default)s)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--threads-per-rank", type=int, default=1)
    ap.add_argument("--control-threads", type=int, default=0,
                    help="the control's threads (default: the cores the largest layout uses, "
                         "at most the CPU count)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per layout")
    ap.add_argument("--tiny", action="store_true", help="smoke run on a scaled-down config")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.prompts < 1 or args.prompt_tokens < 2:
        ap.error("--prompts must be >= 1 and --prompt-tokens >= 2")
    if args.threads_per_rank < 1 or args.control_threads < 0:
        ap.error("--threads-per-rank must be >= 1 (and --control-threads >= 0)")
    if args.checkpoint is not None and not (args.checkpoint / "config.json").is_file():
        ap.error(f"--checkpoint {args.checkpoint}: no config.json there")
    layouts = [parse_layout(t) for t in args.layouts.split(";") if t.strip()]
    if not layouts:
        ap.error("--layouts: no layout given")
    args.work_dir = args.work_dir.resolve()  # the run spec's attempt.dir must be absolute
    args.checkpoints_dir = args.checkpoints_dir.resolve()

    python = str(ROOT / ".venv" / "bin" / "python")
    worker = args.build_dir / "bin" / "gatehouse-worker"
    plugin = args.build_dir / "lib" / "libgatehouse_models.so"
    for f in (worker, plugin):
        if not f.exists():
            raise SystemExit(f"{f} is missing: build gatehouse-worker and gatehouse_models first")
    # The C++ lane (the in-tree plugin's plans) or the Python lane (a reference adapter's own
    # parallelize and FSDP2, docs/protocols.md §9.1).
    lane_args = (["--python-entry", args.python_entry, "--python-path", str(ROOT / "adapters" / "python")]
                 if args.python_entry else ["--plugin", str(plugin)])
    args.work_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = args.checkpoint
    if checkpoint is None:
        checkpoint = real_size.ensure_checkpoint(args.checkpoints_dir, args.tiny, python,
                                                 dict(os.environ))
    checkpoint = checkpoint.resolve()
    config = json.loads((checkpoint / "config.json").read_text())
    bundle = ensure_bundle(args.work_dir, checkpoint, python, args.prompts, args.prompt_tokens,
                           config["vocab_size"])
    cores = os.cpu_count() or 1
    control_threads = args.control_threads or min(
        cores, max(world_of(l) for l in layouts) * args.threads_per_rank)

    def label(layout):
        return " x ".join(f"{k}={v}" for k, v in layout.items())

    started = time.monotonic()
    print("[parallel_layouts] control (world size 1)", file=sys.stderr)
    control = summarize("control (1 rank)", run_layout(
        worker, lane_args, run_spec(checkpoint, bundle, args.family, args.precision, {},
                                 args.work_dir / "attempts" / "control"),
        1, control_threads, args.timeout))
    if "error" in control:
        raise SystemExit(f"the control did not measure: {control['error']}")
    rows = []
    for layout in layouts:
        name = label(layout)
        print(f"[parallel_layouts] {name} ({world_of(layout)} ranks)", file=sys.stderr)
        attempt = args.work_dir / "attempts" / name.replace(" ", "").replace("=", "")
        rows.append(summarize(name, run_layout(
            worker, lane_args, run_spec(checkpoint, bundle, args.family, args.precision, layout, attempt),
            world_of(layout), args.threads_per_rank, args.timeout)))
    meta = {"checkpoint_name": checkpoint.parent.name if checkpoint.name == "checkpoint" else checkpoint.name,
            "precision": args.precision, "cores": cores, "threads": args.threads_per_rank,
            "control_threads": control_threads, "prompts": args.prompts,
            "lane": f"Python lane ({args.python_entry})" if args.python_entry else "C++ lane",
            "tokens": args.prompt_tokens, "wall_s": time.monotonic() - started}
    print_table(rows, control, meta)
    # The same global batch: step 1's loss agrees with the control's, or the layouts did not do
    # the same computation and their figures compare nothing.
    bar = 1e-5 if args.precision == "fp32" else 1e-2
    bad = [r["layout"] for r in rows if "error" not in r and same_batch(r, control) and
           loss_rel_diff(r, control) > bar]
    if bad:
        print(f"\nLOSS MISMATCH (step 1, relative bar {bar:g}): {', '.join(bad)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": meta, "control": control, "layouts": rows}, indent=2))
    return 1 if bad or any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
