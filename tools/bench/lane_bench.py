#!/usr/bin/env python3
"""One cell on the Python lane beside the C++ lane: same worker, checkpoint, bundle and phases.

What
    Runs ``gatehouse-worker`` on one fixture (a checkpoint folder with its reference bundle)
    twice per round, A B A B: A with the Python lane (``--python-entry``, the reference adapter
    in adapters/python/gh_archon) and B with the in-tree C++ plugin. For each phase it prints
    the median wall time of each lane (the phase_end events' duration_ms), their ratio, and the
    peak resident set; the whole run's wall time too. Both lanes must PASS every phase for the
    times to mean anything: a lane that does not is reported and the script exits 1.

CLI
    python tools/bench/lane_bench.py --build-dir build --fixture build/testdata-trained/smollm2-135m-instruct
        [--family llama] [--precision fp32] [--rounds 3] [--phases config construct ...]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "parity"))
from parity_table import PHASES, PYTHON_ADAPTERS, phase_events, run_spec  # noqa: E402


def run(worker, lane_args, fixture, family, precision, phases):
    """One worker run; returns (wall s, {phase: (status, duration_ms, peak_rss_bytes)})."""
    with tempfile.TemporaryDirectory(prefix="gh-lane-bench-") as tmp:
        tmp = Path(tmp)
        spec = run_spec(fixture, family, precision, tmp)
        spec["phases"] = phases
        (tmp / "run.json").write_text(json.dumps(spec))
        start = time.monotonic()
        proc = subprocess.run([str(worker), "--run-spec", str(tmp / "run.json"), *lane_args],
                              capture_output=True, text=True, timeout=3000)
        wall = time.monotonic() - start
    out = {}
    for phase, p in phase_events(proc.stdout).items():
        if phase in phases and "status" in p:
            out[phase] = (p["status"], p["duration_ms"], p.get("peak_rss_bytes", 0), p["reason"])
    return wall, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", type=Path, default=ROOT / "build")
    ap.add_argument("--fixture", type=Path, required=True, help="folder with checkpoint/ and reference/")
    ap.add_argument("--family", default="llama", choices=sorted(PYTHON_ADAPTERS))
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--phases", nargs="+", default=PHASES)
    args = ap.parse_args(argv)
    worker = args.build_dir / "bin" / "gatehouse-worker"
    plugin = args.build_dir / "lib" / "libgatehouse_models.so"
    lanes = {
        "python": ["--python-entry", PYTHON_ADAPTERS[args.family],
                   "--python-path", str(ROOT / "adapters" / "python")],
        "cpp": ["--plugin", str(plugin)],
    }
    results = {lane: [] for lane in lanes}
    for r in range(args.rounds):
        for lane, lane_args in lanes.items():
            results[lane].append(run(worker, lane_args, args.fixture.resolve(), args.family,
                                     args.precision, args.phases))
            print(f"round {r + 1} {lane}: {results[lane][-1][0]:.1f} s", file=sys.stderr)
    bad = [f"{lane} {p}: {v[0]} {v[3][:200]}" for lane, runs in results.items() for _, ph in runs
           for p, v in ph.items() if v[0] != "PASS"]
    print(f"# {args.fixture.name}, {args.family}, {args.precision}, {args.rounds} rounds A B "
          "(medians)\n")
    print("| phase | Python lane ms | C++ lane ms | Python / C++ | Python peak RSS MB | C++ peak RSS MB |")
    print("|---|---|---|---|---|---|")
    for p in args.phases:
        med = {}
        peak = {}
        for lane, runs in results.items():
            vals = [ph[p][1] for _, ph in runs if p in ph]
            med[lane] = statistics.median(vals) if vals else float("nan")
            peak[lane] = max((ph[p][2] for _, ph in runs if p in ph), default=0) / 2**20
        ratio = med["python"] / med["cpp"] if med["cpp"] else float("inf")
        print(f"| {p} | {med['python']:.0f} | {med['cpp']:.0f} | {ratio:.2f} | "
              f"{peak['python']:.0f} | {peak['cpp']:.0f} |")
    wall = {lane: statistics.median(w for w, _ in runs) for lane, runs in results.items()}
    print(f"| whole worker run (s) | {wall['python']:.1f} | {wall['cpp']:.1f} | "
          f"{wall['python'] / wall['cpp']:.2f} | | |")
    if bad:
        print("\nnot PASS: " + "; ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
