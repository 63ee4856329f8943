#!/usr/bin/env python3
"""The transformers side of tools/bench/real_size.py: one measurement per process.

real_size.py starts this script once per measurement, so that each process's peak RSS
(resource.getrusage ru_maxrss) belongs to that measurement alone:

  make-checkpoint --config FILE --out DIR [--init-seed 0] [--dtype float32|bfloat16]
      A random model of config FILE (a config.json; "torch_dtype", "dtype" and
      "transformers_version" are dropped) from torch.manual_seed(init_seed), in --dtype
      (default fp32), written by save_pretrained as one model.safetensors.
  make-sharded-checkpoint --config FILE --out DIR [--init-seed 0] [--dtype bfloat16]
      [--max-shard-size 5GB]
      The same model, written without ever holding it: the tensors' names and shapes come from
      the model built on the meta device (the tied output head dropped, as save_pretrained
      drops it), each tensor's random values (normal(0, initializer_range); norm weights 1) are
      made and written one slice at a time into safetensors shards split as save_pretrained
      splits them (huggingface_hub's split_torch_state_dict_into_shards), with
      model.safetensors.index.json as transformers writes it and config.json with
      "torch_dtype". Peak memory: one 16 Mi-element slice. For checkpoints larger than the
      memory can comfortably hold twice (a 7B model in bf16: 13.5 GB).
  load --checkpoint DIR
      AutoModelForCausalLM.from_pretrained(DIR, dtype=--dtype, default float32) on the CPU: its wall time (the
      model's module imported before, timed apart as import_s) and the peak RSS right after it; then one read of every parameter (p.sum(): from_pretrained
      may leave the weights memory-mapped, read on first use), timed, and the peak RSS after it.
  forward --checkpoint DIR --bundle DIR
      The load, then one forward of each probe prompt of the reference bundle (the ids the
      reference cell used, `prompts.<i>.input_ids`) as the inference gate runs them: eval(),
      no grad, batch 1, no KV cache, logits as float32. The first pass (cold, as the gate runs
      once) and a second pass (warm) are timed; the peak RSS is taken after the forwards. Then
      the cost of the gate's comparison on the same shapes: reading the whole bundle
      (reference.json + reference.safetensors, as the worker reads it before the inference
      gate's forwards) and LogitComparison::Add (worker_lib/src/logit_comparison.cc) in
      float64 per prompt. Without --bundle: --lengths of seeded random ids, comparison against
      a copy of the logits, no bundle read.
  train --checkpoint DIR --bundle DIR --steps S --lr LR --seed SEED
      The load, then the training gate's steps (worker_lib/src/gates_compute.cc TrainingGate,
      tools/refgen/make_checkpoint.py training_trace): step s trains on probe prompt (s-1) mod P
      (prompts of >= 2 tokens), inputs ids[:-1], labels ids[1:], float32 cross-entropy,
      backward, torch.optim.AdamW(lr) step with torch's defaults. Each step timed; losses and
      the peak RSS after the steps.

  decode --checkpoint DIR --bundle DIR --max-new-tokens N
      The decode gate's work (worker_lib/src/gates_compute.cc DecodeGate): per prompt, the
      KV-cached decode along the bundle's greedy ids (each step's logits as float32), its four
      comparisons with the bundle's decode and continuation logits, and a free greedy decode of
      N tokens (transformers' DynamicCache, one token per forward, as the gate steps).
  packing --checkpoint DIR --bundle DIR
      The packing gate's work (gates_packing.cc): the prompts packed into one row (positions
      restarting per sequence) against each alone, then the unpacked batch's backward and the
      packed step's, the gradients compared per parameter in float64.
  logprob --checkpoint DIR --bundle DIR --max-new-tokens N --seed SEED
      The logprob_parity gate's work (gates_logprob.cc): N tokens sampled per prompt with the
      KV cache, the cached decode along the bundle's greedy ids, one packed train-mode forward
      without autograd over every prompt with its sampled and its greedy tokens.

Each of decode, packing and logprob times its parts apart, as the gates' figures do, and
reports a figure the gate also reports (greedy ids matched, packed vs alone, rollout vs
training log-probs) as a check that it did the same work.

load, forward, train, decode, packing and logprob take --dtype float32|bfloat16 (the validation cell's precision: the
model is loaded in it, the forwards and training steps run in it; logits are compared as float32).
Every mode takes --threads N (torch.set_num_threads; real_size.py also sets OMP_NUM_THREADS
and MKL_NUM_THREADS) and --attn (transformers' attention implementation: "sdpa", its
default, or "eager", which the reference bundle uses). Prints one JSON object on standard
output; transformers' own messages go to standard error.
"""

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def peak_rss_bytes():
    """This process's peak resident set size so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cpu_share(cpu_s, wall_s, threads):
    """Process CPU time over wall time x threads: about 1 when the threads ran undisturbed,
    lower when other processes took the cores (tools/bench/README.md, "cpu share")."""
    return cpu_s / (wall_s * threads) if wall_s > 0 else None


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_model(checkpoint, attn, dtype="float32"):
    """from_pretrained in `dtype` (fp32 unless told) on the CPU; returns (model, timings, peak RSS after it).

    The model class's module is imported first (AutoConfig + the causal-LM mapping), timed
    apart as "import_s": from_pretrained_s is the load itself, as a process that has already
    imported its model code pays it."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    t0 = time.perf_counter()
    config = transformers.AutoConfig.from_pretrained(str(checkpoint))
    MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]  # imports modeling_<type>.py
    import_s = time.perf_counter() - t0
    rss_before = peak_rss_bytes()
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=DTYPES[dtype],
                                                 attn_implementation=attn)
    seconds = time.perf_counter() - t0
    return model, {"from_pretrained_s": seconds, "import_s": import_s,
                   "peak_rss_before_load_bytes": rss_before}, peak_rss_bytes()


def probe_prompts(args, vocab_size):
    """The reference bundle's prompt ids, or seeded random ids of --lengths."""
    if args.bundle:
        prompts = [r["prompts.{i}.input_ids"].long()
                   for r in bundle_tensors(args, ["prompts.{i}.input_ids"])]
        if not prompts:
            raise SystemExit(f"{args.bundle}/reference.safetensors holds no prompts.<i>.input_ids")
        return prompts, "reference bundle"
    lengths = [int(x) for x in args.lengths.split(",") if x]
    gen = torch.Generator().manual_seed(args.seed)
    return ([torch.randint(3, vocab_size, (n,), generator=gen, dtype=torch.long) for n in lengths],
            f"random ids (seed {args.seed})")


def logit_comparison(ref, ours):
    """LogitComparison::Add of the worker, op for op (both tensors [T, V])."""
    r = ref.detach().to(torch.float64)
    o = ours.detach().to(torch.float64)
    log_p = torch.log_softmax(r, -1)
    log_q = torch.log_softmax(o, -1)
    p = log_p.exp()
    terms = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p))
    kl = terms.sum(-1)
    diff = (r - o).abs()
    return {"kl_sum": kl.sum().item(), "kl_max": kl.max().item(),
            "top1_equal": int((r.argmax(-1) == o.argmax(-1)).sum().item()),
            "max_abs": diff.max().item(), "abs_sum": diff.sum().item()}


def config_of(path):
    """The transformers config of a config.json, its dtype and version fields dropped."""
    cfg = json.loads(Path(path).read_text())
    for key in ("torch_dtype", "dtype", "transformers_version"):
        cfg.pop(key, None)
    model_type = cfg.pop("model_type", None)
    if not model_type:
        raise SystemExit(f"{path}: no model_type")
    return transformers.AutoConfig.for_model(model_type, **cfg), model_type


def cmd_make_checkpoint(args):
    config, model_type = config_of(args.config)
    torch.manual_seed(args.init_seed)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[args.dtype or "float32"])
    out = Path(args.out)
    model.save_pretrained(str(out), safe_serialization=True, max_shard_size="100GB")
    files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    return {"mode": "make-checkpoint", "out": str(out), "model_type": model_type,
            "parameters": sum(p.numel() for p in model.parameters()),
            "seconds": time.perf_counter() - t0, "files": files}


SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16"}
SLICE_ELEMENTS = 16 << 20


def cmd_make_sharded_checkpoint(args):
    """A checkpoint written tensor by tensor, one slice at a time (see the module's doc)."""
    import struct

    from huggingface_hub import split_torch_state_dict_into_shards

    dtype = DTYPES[args.dtype or "bfloat16"]
    config, model_type = config_of(args.config)
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    state = model.state_dict()
    if getattr(config, "tie_word_embeddings", False):
        for target in dict(getattr(model, "_tied_weights_keys", None) or {}):
            state.pop(target, None)
    split = split_torch_state_dict_into_shards(state, filename_pattern="model{suffix}.safetensors",
                                               max_shard_size=int(args.max_shard_size) if args.max_shard_size.isdigit() else args.max_shard_size)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    std = float(getattr(config, "initializer_range", 0.02))
    gen = torch.Generator().manual_seed(args.init_seed)
    element = torch.tensor([], dtype=dtype).element_size()
    written = 0
    for shard, names in split.filename_to_tensors.items():
        names = sorted(names)
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name in names:
            n = state[name].numel() * element
            header[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(state[name].shape),
                            "data_offsets": [offset, offset + n]}
            offset += n
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        with open(out / shard, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for name in names:
                count = state[name].numel()
                # RMSNorm / LayerNorm weights start at 1 (as transformers initialises them).
                is_norm = state[name].dim() == 1 and "norm" in name
                for start in range(0, count, SLICE_ELEMENTS):
                    k = min(SLICE_ELEMENTS, count - start)
                    if is_norm:
                        chunk = torch.ones(k, dtype=dtype)
                    else:
                        chunk = (torch.randn(k, generator=gen, dtype=torch.float32) * std).to(dtype)
                    f.write(chunk.view(torch.int16 if element == 2 else torch.int32).numpy().tobytes())
                    written += k * element
    if split.is_sharded:
        index = {"metadata": {"total_parameters": sum(t.numel() for t in state.values()),
                              **split.metadata},
                 "weight_map": split.tensor_to_filename}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    cfg = config.to_dict()
    cfg.pop("dtype", None)
    cfg["torch_dtype"] = str(dtype).replace("torch.", "")
    cfg["transformers_version"] = transformers.__version__
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    return {"mode": "make-sharded-checkpoint", "out": str(out), "model_type": model_type,
            "parameters": sum(t.numel() for t in state.values()), "bytes_written": written,
            "shards": len(split.filename_to_tensors), "seconds": time.perf_counter() - t0,
            "files": files, "peak_rss_bytes": peak_rss_bytes()}


def cmd_load(args):
    model, timings, rss = load_model(args.checkpoint, args.attn, args.dtype or "float32")
    # from_pretrained may leave the weights memory-mapped from the safetensors file, read on
    # first use: reading every parameter once shows what materialising them costs.
    t0 = time.perf_counter()
    with torch.no_grad():
        for p in model.parameters():
            p.sum()
    touch_s = time.perf_counter() - t0
    return {"mode": "load", **timings, "peak_rss_bytes": rss, "touch_s": touch_s,
            "peak_rss_after_touch_bytes": peak_rss_bytes(),
            "parameters": sum(p.numel() for p in model.parameters())}


def cmd_forward(args):
    model, timings, load_rss = load_model(args.checkpoint, args.attn, args.dtype or "float32")
    prompts, source = probe_prompts(args, model.config.vocab_size)
    model.eval()

    def one_pass():
        times, logits = [], []
        with torch.no_grad():
            for ids in prompts:
                t0 = time.perf_counter()
                out = model(input_ids=ids.unsqueeze(0), use_cache=False).logits[0].to(torch.float32)
                times.append(time.perf_counter() - t0)
                logits.append(out)
        return times, logits

    c0 = time.process_time()
    cold, logits = one_pass()
    cold_cpu = time.process_time() - c0
    rss_after_cold = peak_rss_bytes()
    warm, _ = one_pass()
    result = {"mode": "forward", "prompt_source": source,
              "prompt_lengths": [int(p.numel()) for p in prompts],
              **timings, "peak_rss_after_load_bytes": load_rss,
              "forward_cold_s": sum(cold), "forward_cold_per_prompt_s": cold,
              "forward_cold_cpu_share": cpu_share(cold_cpu, sum(cold), torch.get_num_threads()),
              "forward_warm_s": sum(warm), "forward_warm_per_prompt_s": warm,
              "peak_rss_after_forwards_bytes": rss_after_cold, "peak_rss_bytes": peak_rss_bytes()}
    # The comparison's cost, measured after the RSS figures above (it holds the bundle).
    read_s = None
    if args.bundle:
        from safetensors.torch import load_file

        t0 = time.perf_counter()
        json.loads((Path(args.bundle) / "reference.json").read_text())
        # load_file maps the file; clone() reads it, as the worker reads the whole bundle.
        tensors = {k: v.clone() for k, v in load_file(str(Path(args.bundle) / "reference.safetensors")).items()}
        read_s = time.perf_counter() - t0
        refs = [tensors[f"prompts.{i}.logits"] for i in range(len(prompts))]
    else:
        refs = [x.clone() for x in logits]
    t0 = time.perf_counter()
    figures = [logit_comparison(r, o) for r, o in zip(refs, logits)]
    compare_s = time.perf_counter() - t0
    tokens = sum(int(p.numel()) for p in prompts)
    result.update({
        "bundle_read_s": read_s, "compare_s": compare_s,
        "comparison_cost_s": compare_s + (read_s or 0.0),
        # Against the bundle (eager attention, the reference runner's threads): a sanity check
        # that the peer ran the same model on the same ids.
        "vs_bundle": {"max_abs_diff": max(f["max_abs"] for f in figures),
                      "kl_mean": sum(f["kl_sum"] for f in figures) / tokens,
                      "top1_agreement_percent": 100.0 * sum(f["top1_equal"] for f in figures) / tokens}
        if args.bundle else None,
    })
    return result


def cmd_train(args):
    model, timings, load_rss = load_model(args.checkpoint, args.attn, args.dtype or "float32")
    prompts, source = probe_prompts(args, model.config.vocab_size)
    usable = [p for p in prompts if p.numel() >= 2]
    if not usable:
        raise SystemExit("no probe prompt has 2 or more tokens to train on")
    model.train()
    torch.manual_seed(args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    step_s, fb_s, opt_s, losses, lengths = [], [], [], [], []
    c0 = time.process_time()
    for step in range(1, args.steps + 1):
        ids = usable[(step - 1) % len(usable)]
        t0 = time.perf_counter()
        optimizer.zero_grad()
        logits = model(input_ids=ids[:-1].unsqueeze(0), use_cache=False).logits.to(torch.float32)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), ids[1:])
        loss.backward()
        t1 = time.perf_counter()
        optimizer.step()
        losses.append(loss.item())
        step_s.append(time.perf_counter() - t0)
        fb_s.append(t1 - t0)
        opt_s.append(step_s[-1] - fb_s[-1])
        lengths.append(int(ids.numel()) - 1)
    return {"mode": "train", "prompt_source": source, "steps": args.steps, "lr": args.lr,
            "seed": args.seed, "step_input_lengths": lengths, **timings,
            "peak_rss_after_load_bytes": load_rss,
            "step_s": step_s, "train_s": sum(step_s),
            "step_forward_backward_s": fb_s, "step_optimizer_s": opt_s,
            "train_cpu_share": cpu_share(time.process_time() - c0, sum(step_s), torch.get_num_threads()),
            "step_mean_s": sum(step_s) / len(step_s), "losses": losses,
            "peak_rss_bytes": peak_rss_bytes()}


# --- the decode, packing and logprob_parity gates' work, done by transformers ----------------

def bundle_tensors(args, names):
    """The bundle's tensors `names` (each a format string of the prompt index i), per prompt."""
    from safetensors import safe_open

    out = []
    with safe_open(str(Path(args.bundle) / "reference.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        i = 0
        while f"prompts.{i}.input_ids" in keys:
            out.append({n: f.get_tensor(n.format(i=i)) for n in names})
            i += 1
    return out


def run_suffix(dtype):
    """The bundle's tensor suffix of the cell's precision ("" fp32, "_bf16")."""
    return "_bf16" if dtype == "bfloat16" else ""


def new_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def cached_step(model, ids, cache):
    """One forward of ids [1, k] after what `cache` holds (positions continue from its length),
    the cache extended: the logits [1, k, V]."""
    return model(input_ids=ids, past_key_values=cache, use_cache=True).logits


def forced_decode_logits(model, prompt, forced):
    """The decode gate's ForcedDecodeLogits: the prompt, then forced[:-1] one token at a time
    with the KV cache; each step's last-position logits as float32, [n, V]."""
    with torch.no_grad():
        cache = new_cache(model)
        rows = [cached_step(model, prompt.unsqueeze(0), cache)[0, -1].float()]
        for s in range(1, forced.numel()):
            rows.append(cached_step(model, forced[s - 1].view(1, 1), cache)[0, -1].float())
    return torch.stack(rows)


def greedy_decode(model, prompt, n):
    """The decode gate's GreedyDecode: n tokens, argmax at each step, with the KV cache."""
    with torch.no_grad():
        cache = new_cache(model)
        nxt = cached_step(model, prompt.unsqueeze(0), cache)[0, -1].argmax()
        ids = [int(nxt)]
        for _ in range(1, n):
            nxt = cached_step(model, nxt.view(1, 1), cache)[0, -1].argmax()
            ids.append(int(nxt))
    return torch.tensor(ids)


def packed_positions(seqs):
    """One row of sequences: ids [1, sum T] and positions restarting at 0 at each sequence
    (transformers finds the sequences' bounds from the restarts and masks each apart)."""
    ids = torch.cat(seqs).unsqueeze(0)
    pos = torch.cat([torch.arange(s.numel()) for s in seqs]).unsqueeze(0)
    return ids, pos


def cmd_decode(args):
    """The decode gate's work (worker_lib/src/gates_compute.cc DecodeGate): per prompt, the
    decode along upstream's greedy ids with the KV cache and its four comparisons with the
    bundle's decode and continuation logits, then a free greedy decode."""
    model, timings, _ = load_model(args.checkpoint, args.attn, args.dtype or "float32")
    model.eval()
    sfx = run_suffix(args.dtype)
    n = args.max_new_tokens
    runs = bundle_tensors(args, ["prompts.{i}.input_ids", "prompts.{i}.greedy_ids" + sfx,
                                 "prompts.{i}.decode_logits" + sfx,
                                 "prompts.{i}.continuation_logits" + sfx])
    forced_s = compare_s = greedy_s = 0.0
    matched = total = 0
    steps_max_abs = 0.0
    c0 = time.process_time()
    t_all = time.perf_counter()
    for r in runs:
        prompt = r["prompts.{i}.input_ids"].long()
        forced = r["prompts.{i}.greedy_ids" + sfx][:n].long()
        dec = r["prompts.{i}.decode_logits" + sfx][:n]
        cont = r["prompts.{i}.continuation_logits" + sfx][:n]
        t0 = time.perf_counter()
        steps = forced_decode_logits(model, prompt, forced)
        forced_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        figures = [logit_comparison(dec, steps), logit_comparison(cont, steps),
                   logit_comparison(cont, dec), logit_comparison(dec, cont)]
        compare_s += time.perf_counter() - t0
        steps_max_abs = max(steps_max_abs, figures[0]["max_abs"])
        t0 = time.perf_counter()
        ours = greedy_decode(model, prompt, n)
        greedy_s += time.perf_counter() - t0
        matched += int((ours == forced).sum())
        total += n
    wall = time.perf_counter() - t_all
    return {"mode": "decode", "prompts": len(runs), "max_new_tokens": n, **timings,
            "decode_s": wall, "forced_decode_s": forced_s, "comparison_s": compare_s,
            "greedy_decode_s": greedy_s,
            "cpu_share": cpu_share(time.process_time() - c0, wall, torch.get_num_threads()),
            # A sanity check that the peer decoded what the bundle holds.
            "greedy_matched": matched, "greedy_total": total,
            "steps_vs_bundle_max_abs_diff": steps_max_abs, "peak_rss_bytes": peak_rss_bytes()}


def cmd_packing(args):
    """The packing gate's work (worker_lib/src/gates_packing.cc): the prompts packed into one
    row against each alone (eval, no grad), then the unpacked batch's backward (each sequence's
    summed cross-entropy over the batch's predicted tokens) and the packed step's, their
    gradients compared per parameter in float64."""
    model, timings, _ = load_model(args.checkpoint, args.attn, args.dtype or "float32")
    prompts, _ = probe_prompts(args, model.config.vocab_size)
    out = {"mode": "packing", "sequences": len(prompts), **timings}
    c0 = time.process_time()
    t_all = time.perf_counter()
    model.eval()
    with torch.no_grad():
        ids, pos = packed_positions(prompts)
        t0 = time.perf_counter()
        packed = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
        out["packed_forward_s"] = time.perf_counter() - t0
        alone_s = compare_s = 0.0
        bound, worst = 0, 0.0
        for p in prompts:
            t0 = time.perf_counter()
            alone = model(input_ids=p.unsqueeze(0), use_cache=False).logits[0]
            alone_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            f = logit_comparison(alone.float(), packed[bound:bound + p.numel()].float())
            compare_s += time.perf_counter() - t0
            worst = max(worst, f["max_abs"])
            bound += p.numel()
        # Near 0 when transformers masked each sequence apart (a leak across sequences would
        # show as a large difference).
        out.update({"alone_forwards_s": alone_s, "logit_comparison_s": compare_s,
                    "packed_vs_alone_max_abs_diff": worst})
        del packed
    inputs = [p[:-1] for p in prompts if p.numel() >= 2]
    labels = [p[1:] for p in prompts if p.numel() >= 2]
    predicted = sum(x.numel() for x in labels)
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    for p in params:
        p.grad = None
    t0 = time.perf_counter()
    for x, y in zip(inputs, labels):
        logits = model(input_ids=x.unsqueeze(0), use_cache=False).logits[0].float()
        loss = torch.nn.functional.cross_entropy(logits, y, reduction="sum") / predicted
        loss.backward()
    out["unpacked_step_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with torch.no_grad():
        norms = [p.grad.double().pow(2).sum().sqrt().item() if p.grad is not None else 0.0
                 for p in params]
    norms_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ids, pos = packed_positions(inputs)
    logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0].float()
    loss = torch.nn.functional.cross_entropy(logits, torch.cat(labels))
    (-loss).backward()
    out["packed_step_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with torch.no_grad():
        rel = [(p.grad.double().pow(2).sum().sqrt().item() / n) if p.grad is not None and n > 0 else 0.0
               for p, n in zip(params, norms)]
    out["gradient_comparison_s"] = norms_s + time.perf_counter() - t0
    wall = time.perf_counter() - t_all
    out.update({"packing_s": wall, "grad_rel_diff_max": max(rel) if rel else None,
                "cpu_share": cpu_share(time.process_time() - c0, wall, torch.get_num_threads()),
                "peak_rss_bytes": peak_rss_bytes()})
    return out


def cmd_logprob(args):
    """The logprob_parity gate's work (worker_lib/src/gates_logprob.cc): per prompt, n tokens
    sampled with the KV cache at temperature 1 (float32 log_softmax, a draw from a CPU generator
    seeded with the cell's training seed); the KV-cached decode along upstream's greedy ids;
    then one packed train-mode forward without autograd over every prompt with its sampled
    tokens and with upstream's greedy tokens, each target's log-prob gathered."""
    model, timings, _ = load_model(args.checkpoint, args.attn, args.dtype or "float32")
    sfx = run_suffix(args.dtype)
    n = args.max_new_tokens
    runs = bundle_tensors(args, ["prompts.{i}.input_ids", "prompts.{i}.greedy_ids" + sfx])
    prompts = [r["prompts.{i}.input_ids"].long() for r in runs]
    greedy = [r["prompts.{i}.greedy_ids" + sfx][:n].long() for r in runs]
    out = {"mode": "logprob", "prompts": len(prompts), "max_new_tokens": n, **timings}
    c0 = time.process_time()
    t_all = time.perf_counter()
    model.eval()
    gen = torch.Generator().manual_seed(args.seed)
    sampled, sampled_logprobs = [], []
    t0 = time.perf_counter()
    with torch.no_grad():
        for p in prompts:
            cache = new_cache(model)
            logits = cached_step(model, p.unsqueeze(0), cache)
            ids, lps = [], []
            for step in range(n):
                logp = torch.log_softmax(logits[0, -1].float(), -1)
                tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
                ids.append(tok)
                lps.append(float(logp[tok]))
                if step + 1 < n:
                    logits = cached_step(model, torch.tensor([[tok]]), cache)
            sampled.append(torch.tensor(ids))
            sampled_logprobs.append(torch.tensor(lps, dtype=torch.float64))
    out["rollout_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for p, g in zip(prompts, greedy):
        logits = forced_decode_logits(model, p, g)
        torch.log_softmax(logits, -1).gather(1, g.unsqueeze(1))
    out["forced_decode_s"] = time.perf_counter() - t0
    sequences = [torch.cat([p, s[:-1]]) for p, s in zip(prompts, sampled)]
    sequences += [torch.cat([p, g[:-1]]) for p, g in zip(prompts, greedy)]
    targets = sampled + greedy
    model.train()
    t0 = time.perf_counter()
    diffs = []
    with torch.no_grad():
        ids, pos = packed_positions(sequences)
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
        bound = 0
        for i, (seq, tgt) in enumerate(zip(sequences, targets)):
            t = prompts[i % len(prompts)].numel()
            logp = torch.log_softmax(logits[bound + t - 1:bound + t - 1 + tgt.numel()].float(), -1)
            scored = logp.gather(1, tgt.unsqueeze(1)).squeeze(1).double()
            if i < len(prompts):
                diffs.append((scored - sampled_logprobs[i]).abs())
            bound += seq.numel()
    out["training_forward_s"] = time.perf_counter() - t0
    wall = time.perf_counter() - t_all
    d = torch.cat(diffs)
    out.update({"logprob_s": wall, "sampled_tokens": int(d.numel()),
                # The same figure as the gate's (rollout vs training log-probs), transformers'
                # own: a sanity check that the peer did the same work.
                "mean_abs_diff": float(d.mean()), "max_abs_diff": float(d.max()),
                # The gate's rollout_logprob_mean: what the seed's draws scored.
                "rollout_logprob_mean": float(torch.cat(sampled_logprobs).mean()),
                "cpu_share": cpu_share(time.process_time() - c0, wall, torch.get_num_threads()),
                "peak_rss_bytes": peak_rss_bytes()})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["make-checkpoint", "make-sharded-checkpoint", "load", "forward", "train",
                                     "decode", "packing", "logprob"])
    ap.add_argument("--checkpoint", help="HF checkpoint directory (load, forward, train)")
    ap.add_argument("--bundle", help="reference bundle directory: the probe prompts' ids")
    ap.add_argument("--lengths", default="7,33,300",
                    help="without --bundle: probe prompt lengths of seeded random ids")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--steps", type=int, default=2, help="training steps (the cell's)")
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW lr (the cell's)")
    ap.add_argument("--seed", type=int, default=1234,
                    help="training seed / random-id seed / logprob: the sampling seed (the cell's training seed)")
    ap.add_argument("--max-new-tokens", type=int, default=32,
                    help="decode, logprob: tokens per prompt (the cell's decode.max_new_tokens)")
    ap.add_argument("--config", help="make-checkpoint: config.json to instantiate")
    ap.add_argument("--out", help="make-checkpoint: output directory")
    ap.add_argument("--init-seed", type=int, default=0, help="make-checkpoint: torch.manual_seed")
    ap.add_argument("--dtype", choices=sorted(DTYPES),
                    help="make-checkpoint: the saved dtype (default float32); make-sharded-checkpoint: "
                         "(default bfloat16); load, forward, train: the model's dtype (default float32)")
    ap.add_argument("--max-shard-size", default="5GB",
                    help="make-sharded-checkpoint: the largest shard (save_pretrained's max_shard_size)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.mode in ("make-checkpoint", "make-sharded-checkpoint"):
        if not args.config or not args.out:
            ap.error(f"{args.mode} needs --config and --out")
        result = (cmd_make_checkpoint if args.mode == "make-checkpoint" else cmd_make_sharded_checkpoint)(args)
    else:
        if not args.checkpoint:
            ap.error(f"{args.mode} needs --checkpoint")
        if args.mode in ("decode", "packing", "logprob") and not args.bundle:
            ap.error(f"{args.mode} needs --bundle (the reference bundle's prompts and greedy ids)")
        result = {"load": cmd_load, "forward": cmd_forward, "train": cmd_train, "decode": cmd_decode,
                  "packing": cmd_packing, "logprob": cmd_logprob}[args.mode](args)
    result.update({"threads": torch.get_num_threads(), "attn_implementation": args.attn,
                   "torch": torch.__version__, "transformers": transformers.__version__})
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
