#!/usr/bin/env python3
"""How close upstream itself comes to a reference bundle: transformers' own forward on a device.

The inference gate compares the worker's logits with the bundle (tools/refgen), which
transformers computed on the CPU. On another device the same transformers in the same
precision differs from that bundle too (other kernels, other reduction order); this measures
by how much, with the gate's own metrics (KL(reference || run) summed over the vocabulary and
averaged over tokens, top-1 agreement) and greedy decode against the bundle's greedy ids, so a
gate's figure on that device can be read against upstream's. Prints a Markdown table; exit
status 0.

  upstream_floor.py --testdata build/testdata --device cuda --dtype bf16 \
      --variant qwen3-tiny-untied gemma3-tiny-untied
"""

import argparse
import copy
import os

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def compare(ref, run):
    """(sum of per-token KL in nats, tokens, top-1 matches) of run against ref, both [T, V]."""
    log_p = torch.log_softmax(ref.double(), -1)
    log_q = torch.log_softmax(run.double(), -1)
    p = log_p.exp()
    kl = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p)).sum(-1)
    return kl.sum().item(), ref.shape[0], (ref.argmax(-1) == run.argmax(-1)).sum().item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--testdata", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--variant", nargs="+", required=True)
    args = ap.parse_args()
    key = "logits_bf16" if args.dtype == "bf16" else "logits"
    greedy_key = "greedy_ids_bf16" if args.dtype == "bf16" else "greedy_ids"
    print(f"| variant | transformers {args.dtype} on {args.device} vs bundle `{key}`: kl_mean "
          f"| top1_agreement % | vs bundle fp32 `logits`: kl_mean | top1_agreement % "
          f"| greedy vs `{greedy_key}`: tokens matched | first divergence |")
    print("|---|---|---|---|---|---|---|")
    for variant in args.variant:
        root = os.path.join(args.testdata, variant)
        model = AutoModelForCausalLM.from_pretrained(
            os.path.join(root, "checkpoint"), dtype=DTYPES[args.dtype],
            attn_implementation="eager").to(args.device).eval()
        same = [0.0, 0, 0]
        fp32 = [0.0, 0, 0]
        matched, total, first = 0, 0, "none"
        # Plain greedy as tools/refgen makes it: argmax at every step, no eos stop.
        gen_config = copy.deepcopy(model.generation_config)
        gen_config.update(do_sample=False, eos_token_id=[], pad_token_id=0)
        with safe_open(os.path.join(root, "reference", "reference.safetensors"), "pt") as f:
            n = len({k.split(".")[1] for k in f.keys() if k.startswith("prompts.")})
            for i in range(n):
                ids = f.get_tensor(f"prompts.{i}.input_ids").unsqueeze(0).to(args.device)
                with torch.no_grad():
                    logits = model(ids).logits[0].float().cpu()
                    want = f.get_tensor(f"prompts.{i}.{greedy_key}")
                    gen_config.update(max_new_tokens=want.numel())
                    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                         generation_config=gen_config)[0, ids.shape[1]:].cpu()
                eq = out == want
                matched += int(eq.sum())
                total += want.numel()
                if first == "none" and not bool(eq.all()):
                    j = int((~eq).nonzero()[0][0])
                    first = f"prompt {i} position {j}: {int(out[j])} vs {int(want[j])}"
                for acc, name in ((same, key), (fp32, "logits")):
                    kl, t, top1 = compare(f.get_tensor(f"prompts.{i}.{name}"), logits)
                    acc[0] += kl
                    acc[1] += t
                    acc[2] += top1
        print(f"| {variant} | {same[0] / same[1]:.3g} | {100.0 * same[2] / same[1]:.2f} "
              f"| {fp32[0] / fp32[1]:.3g} | {100.0 * fp32[2] / fp32[1]:.2f} "
              f"| {matched}/{total} | {first} |", flush=True)


if __name__ == "__main__":
    main()
