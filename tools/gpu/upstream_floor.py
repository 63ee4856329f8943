#!/usr/bin/env python3
"""How close upstream itself comes to a reference bundle on another site: transformers' own run.

The gates compare the worker with a bundle transformers made (tools/refgen, format
gatehouse-reference/2). On another site (a GPU, or another CPU kernel family) the same
transformers in the same precision differs from that bundle too (other kernels, other reduction
order). This measures by how much, with the gates' own metrics, so that a bar for that site can
be derived from upstream's spread (docs/bars.md):

  - prompt logits vs the bundle's run in the same precision: max abs diff, KL(reference || run)
    summed over the vocabulary and averaged over tokens, top-1 agreement;
  - decode-step logits: transformers' KV-cached generate, fed the bundle's greedy ids (one
    forward per step over the cache), vs the bundle's decode_logits;
  - greedy ids vs the bundle's, first divergence;
  - training: the bundle's trace made again here (tools/refgen/make_checkpoint.py
    training_trace): max relative step-1 gradient-norm and loss differences.

Prints a Markdown table and, with --json FILE, the rows and the worst of each column. Run it
with the site's settings, e.g. another CPU kernel family:
  ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \\
    upstream_floor.py --testdata build/testdata --device cpu --dtype fp32 --all
or a GPU:
  upstream_floor.py --testdata build/testdata --device cuda --dtype bf16 --variant qwen3-tiny-untied
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "refgen"))
import make_checkpoint  # noqa: E402  (logit_spread, training_trace)

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def compare(ref, run):
    """(max abs diff, sum of per-token KL in nats, tokens, top-1 matches) of run against ref."""
    log_p = torch.log_softmax(ref.double(), -1)
    log_q = torch.log_softmax(run.double(), -1)
    p = log_p.exp()
    kl = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p)).sum(-1)
    return ((ref - run).abs().max().item(), kl.sum().item(), ref.shape[0],
            (ref.argmax(-1) == run.argmax(-1)).sum().item())


class Acc:
    def __init__(self):
        self.max_abs, self.kl, self.tokens, self.top1 = 0.0, 0.0, 0, 0

    def add(self, ref, run):
        m, kl, t, top1 = compare(ref, run)
        self.max_abs = max(self.max_abs, m)
        self.kl += kl
        self.tokens += t
        self.top1 += top1

    def row(self):
        return {"max_abs_diff": self.max_abs, "kl_mean": self.kl / max(self.tokens, 1),
                "top1_percent": 100.0 * self.top1 / max(self.tokens, 1)}


@torch.no_grad()
def forced_decode(model, ids, forced, device):
    """KV-cached decode along `forced`: the logits that predict forced[k] as row k."""
    out = model(input_ids=ids.unsqueeze(0).to(device), use_cache=True)
    rows, cache = [out.logits[0, -1].float().cpu()], out.past_key_values
    for k in range(forced.numel() - 1):
        out = model(input_ids=forced[k].view(1, 1).to(device), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        rows.append(out.logits[0, -1].float().cpu())
    return torch.stack(rows)


def measure(root, args):
    suffix = "_bf16" if args.dtype == "bf16" else ""
    meta = json.loads((root / "reference" / "reference.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(
        root / "checkpoint", dtype=DTYPES[args.dtype], attn_implementation="eager").to(args.device).eval()
    logits, steps = Acc(), Acc()
    matched, total, first = 0, 0, "none"
    prompts = []
    with safe_open(str(root / "reference" / "reference.safetensors"), "pt") as f:
        for i in range(meta["num_prompts"]):
            ids = f.get_tensor(f"prompts.{i}.input_ids")
            prompts.append(ids)
            with torch.no_grad():
                ours = model(ids.unsqueeze(0).to(args.device)).logits[0].float().cpu()
            logits.add(f.get_tensor(f"prompts.{i}.logits{suffix}"), ours)
            want = f.get_tensor(f"prompts.{i}.greedy_ids{suffix}")
            steps.add(f.get_tensor(f"prompts.{i}.decode_logits{suffix}"),
                      forced_decode(model, ids, want, args.device))
            config = make_checkpoint.greedy_config(model)
            with torch.no_grad():
                out = model.generate(input_ids=ids.unsqueeze(0).to(args.device),
                                     attention_mask=torch.ones(1, ids.numel(), dtype=torch.long,
                                                               device=args.device),
                                     generation_config=config)
            got = out.sequences[0, ids.numel():].cpu()
            eq = got == want
            matched += int(eq.sum())
            total += want.numel()
            if first == "none" and not bool(eq.all()):
                j = int((~eq).nonzero()[0][0])
                first = f"prompt {i} position {j}: {int(got[j])} vs {int(want[j])}"
    row = {"variant": root.name, "logits": logits.row(), "decode_steps": steps.row(),
           "greedy": f"{matched}/{total}", "first_divergence": first}
    if args.training:
        trace = meta["training"][args.dtype]
        model_class = type(model)
        if args.device != "cpu":
            raise SystemExit("--training runs on the CPU only (make_checkpoint.training_trace)")
        here = make_checkpoint.training_trace(root / "checkpoint", model_class, prompts, DTYPES[args.dtype])
        grad_rel = max(abs(here["grad_norms"][k] - v) / abs(v) if v else 0.0
                       for k, v in trace["grad_norms"].items())
        loss_rel = max(abs(a - b) / abs(b) for a, b in zip(here["losses"], trace["losses"]))
        row["training"] = {"grad_norm_rel": grad_rel, "loss_rel": loss_rel}
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--testdata", required=True, type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--variant", nargs="+")
    ap.add_argument("--all", action="store_true", help="every variant under --testdata")
    ap.add_argument("--training", action="store_true", help="also remake the training trace (CPU)")
    ap.add_argument("--json", type=Path, help="write the rows and the worst figures here")
    args = ap.parse_args()
    names = args.variant or []
    if args.all:
        names = sorted(p.name for p in args.testdata.iterdir() if (p / ".done").is_file())
    if not names:
        ap.error("name --variant ... or --all")
    env = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS",
                                      "ONEDNN_MAX_CPU_ISA") if k in os.environ}
    print(f"transformers {args.dtype} on {args.device} ({torch.backends.cpu.get_cpu_capability()}"
          f"{', ' + str(env) if env else ''}) against the bundles' {args.dtype} runs\n")
    print("| variant | logits max abs | KL | top-1 % | decode steps max abs | KL | top-1 % "
          "| greedy | first divergence |" + (" grad norm rel | loss rel |" if args.training else ""))
    print("|---|---|---|---|---|---|---|---|---|" + ("---|---|" if args.training else ""))
    rows = []
    for name in names:
        r = measure(args.testdata / name, args)
        rows.append(r)
        lg, st = r["logits"], r["decode_steps"]
        line = (f"| {name} | {lg['max_abs_diff']:.3g} | {lg['kl_mean']:.3g} | {lg['top1_percent']:.2f} "
                f"| {st['max_abs_diff']:.3g} | {st['kl_mean']:.3g} | {st['top1_percent']:.2f} "
                f"| {r['greedy']} | {r['first_divergence']} |")
        if args.training:
            line += f" {r['training']['grad_norm_rel']:.3g} | {r['training']['loss_rel']:.3g} |"
        print(line, flush=True)
    worst = {
        part: {"max_abs_diff": max(r[part]["max_abs_diff"] for r in rows),
               "kl_mean": max(r[part]["kl_mean"] for r in rows),
               "top1_percent": min(r[part]["top1_percent"] for r in rows)}
        for part in ("logits", "decode_steps")}
    if args.training:
        worst["training"] = {k: max(r["training"][k] for r in rows) for k in ("grad_norm_rel", "loss_rel")}
    print(f"\nworst: {json.dumps(worst)}")
    if args.json:
        args.json.write_text(json.dumps({"device": args.device, "dtype": args.dtype, "env": env,
                                         "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                                         "rows": rows, "worst": worst}, indent=1) + "\n")


if __name__ == "__main__":
    main()
