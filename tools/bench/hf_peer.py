#!/usr/bin/env python3
"""The transformers side of tools/bench: times forward (prefill) and one training step.

Measures exactly what gatehouse-bench measures (tools/bench/bench_main.cc), on the same
checkpoint, dtype, thread count and token ids:
  - forward: model.eval(), torch.no_grad(), model(tokens [B, T], use_cache=False).logits;
  - train step: model.train(); AdamW.zero_grad(); logits of tokens[:, :-1] (use_cache=False)
    as float32; cross_entropy against tokens[:, 1:]; backward; AdamW.step() with torch.optim's
    defaults (betas, eps, weight decay 0.01) and the given lr.
Tokens are torch.randint(vocab, (B, T)) after torch.manual_seed(seed), as on the C++ side, or
the ids of --tokens-file (a JSON list; batch 1), as the worker's performance gate passes them.
With --decode-tokens N it also times greedy decode as the decode gate runs it: a prefill
through the KV cache, then N - 1 single-token steps (argmax of the last logits), and reports
the mean ms per step after the prefill. --device cuda runs on the GPU (synchronised timings)
and reports the peak of torch.cuda.max_memory_allocated over the measured work.

--attn picks transformers' attention implementation: "sdpa" (transformers' default) or
"eager" (the implementation the Gatehouse llama family mirrors, and the reference bundles use).

Prints one JSON object on standard output (same keys as gatehouse-bench). --profile-ops FILE
also writes {"forward": {op: self_ms}, "train_step": {op: self_ms}} from torch.profiler for one
extra forward and one extra training step.
"""

import argparse
import json
import statistics
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def time_ms(warmup, reps, threads, fn, device="cpu"):
    """Wall ms and process CPU ms of each timed repetition, and the CPU share (process CPU time over wall time x
    threads: about 1 when undisturbed, lower when other processes took the cores)."""
    for _ in range(warmup):
        fn()
    out, cpu = [], []
    for _ in range(reps):
        sync(device)
        c0 = time.process_time()
        t0 = time.perf_counter()
        fn()
        sync(device)
        out.append((time.perf_counter() - t0) * 1000.0)
        cpu.append((time.process_time() - c0) * 1000.0)
    share = sum(cpu) / (sum(out) * threads)
    return out, cpu, share


def self_ms_by_op(prof):
    """{op name: self CPU time in ms} from a torch.profiler run."""
    return {e.key: e.self_cpu_time_total / 1000.0 for e in prof.key_averages()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--profile-ops", help="write per-op self times (JSON) to this file")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--tokens-file", help="JSON list of token ids to use (batch 1) instead of random ones")
    ap.add_argument("--decode-tokens", type=int, default=0, help="also time greedy decode of N tokens")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(a.checkpoint, dtype=DTYPES[a.dtype],
                                                 attn_implementation=a.attn).to(a.device)
    vocab = model.config.vocab_size
    torch.manual_seed(a.seed)
    if a.tokens_file:
        with open(a.tokens_file) as f:
            tokens = torch.tensor([json.load(f)], dtype=torch.long)
        a.batch, a.seq = tokens.shape
    else:
        tokens = torch.randint(vocab, (a.batch, a.seq), dtype=torch.long)
    tokens = tokens.to(a.device)
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    inputs = tokens[:, :-1].contiguous()
    labels = tokens[:, 1:].reshape(-1)

    model.eval()

    def forward():
        with torch.no_grad():
            model(tokens, use_cache=False).logits

    fwd_ms, fwd_cpu, fwd_share = time_ms(a.warmup, a.reps, a.threads, forward, a.device)

    decode_ms_per_token = None
    if a.decode_tokens > 1:
        def decode():
            with torch.no_grad():
                out = model(tokens, use_cache=True)
                past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
                sync(a.device)
                t0 = time.perf_counter()
                for _ in range(a.decode_tokens - 1):
                    out = model(nxt, past_key_values=past, use_cache=True)
                    past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
                sync(a.device)
                return (time.perf_counter() - t0) * 1000.0 / (a.decode_tokens - 1)

        decode()  # warm-up
        decode_ms_per_token = statistics.median(decode() for _ in range(max(a.reps, 1)))

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=a.lr)
    model.train()
    last_loss = [0.0]

    def train_step():
        optimizer.zero_grad()
        logits = model(inputs, use_cache=False).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), labels)
        loss.backward()
        optimizer.step()
        last_loss[0] = loss.item()

    train_ms, train_cpu, train_share = time_ms(a.warmup, a.reps, a.threads, train_step, a.device)

    if a.profile_ops:
        from torch.profiler import ProfilerActivity, profile

        ops = {}
        model.eval()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            forward()
        ops["forward"] = self_ms_by_op(prof)
        model.train()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            train_step()
        ops["train_step"] = self_ms_by_op(prof)
        with open(a.profile_ops, "w") as f:
            json.dump(ops, f, indent=1)

    fwd_med, train_med = statistics.median(fwd_ms), statistics.median(train_ms)
    print(json.dumps({
        "side": "transformers", "attn_implementation": a.attn, "model_type": model.config.model_type,
        "dtype": a.dtype, "threads": torch.get_num_threads(), "batch": a.batch, "seq": a.seq,
        "warmup": a.warmup, "reps": a.reps, "torch": torch.__version__,
        "transformers": transformers.__version__,
        "forward_ms": fwd_ms, "train_step_ms": train_ms,
        "forward_cpu_ms": fwd_cpu, "train_step_cpu_ms": train_cpu,
        "forward_cpu_share": fwd_share, "train_step_cpu_share": train_share,
        "forward_ms_median": fwd_med, "train_step_ms_median": train_med,
        "prefill_tokens_per_s": 1000.0 * a.batch * a.seq / fwd_med,
        "train_tokens_per_s": 1000.0 * a.batch * (a.seq - 1) / train_med,
        "last_loss": last_loss[0], "device": a.device,
        "decode_ms_per_token": decode_ms_per_token,
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if a.device == "cuda" else None,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
