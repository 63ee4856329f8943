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

load, forward and train take --dtype float32|bfloat16 (the validation cell's precision: the
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
        from safetensors import safe_open

        prompts = []
        with safe_open(str(Path(args.bundle) / "reference.safetensors"), framework="pt") as f:
            keys = set(f.keys())
            i = 0
            while f"prompts.{i}.input_ids" in keys:
                prompts.append(f.get_tensor(f"prompts.{i}.input_ids").to(torch.long))
                i += 1
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
    step_s, losses, lengths = [], [], []
    c0 = time.process_time()
    for step in range(1, args.steps + 1):
        ids = usable[(step - 1) % len(usable)]
        t0 = time.perf_counter()
        optimizer.zero_grad()
        logits = model(input_ids=ids[:-1].unsqueeze(0), use_cache=False).logits.to(torch.float32)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), ids[1:])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        step_s.append(time.perf_counter() - t0)
        lengths.append(int(ids.numel()) - 1)
    return {"mode": "train", "prompt_source": source, "steps": args.steps, "lr": args.lr,
            "seed": args.seed, "step_input_lengths": lengths, **timings,
            "peak_rss_after_load_bytes": load_rss,
            "step_s": step_s, "train_s": sum(step_s),
            "train_cpu_share": cpu_share(time.process_time() - c0, sum(step_s), torch.get_num_threads()),
            "step_mean_s": sum(step_s) / len(step_s), "losses": losses,
            "peak_rss_bytes": peak_rss_bytes()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["make-checkpoint", "make-sharded-checkpoint", "load", "forward", "train"])
    ap.add_argument("--checkpoint", help="HF checkpoint directory (load, forward, train)")
    ap.add_argument("--bundle", help="reference bundle directory: the probe prompts' ids")
    ap.add_argument("--lengths", default="7,33,300",
                    help="without --bundle: probe prompt lengths of seeded random ids")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--steps", type=int, default=2, help="training steps (the cell's)")
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW lr (the cell's)")
    ap.add_argument("--seed", type=int, default=1234, help="training seed / random-id seed")
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
        result = {"load": cmd_load, "forward": cmd_forward, "train": cmd_train}[args.mode](args)
    result.update({"threads": torch.get_num_threads(), "attn_implementation": args.attn,
                   "torch": torch.__version__, "transformers": transformers.__version__})
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
