#!/usr/bin/env python3
"""Make tiny, real Hugging Face checkpoints and a reference bundle beside each.

What
    For each variant NAME this writes
      OUT_ROOT/NAME/checkpoint/   config.json, generation_config.json and safetensors weights,
                                  all written by transformers' own ``save_pretrained``; for a
                                  variant made from a published config.json in "hub" form,
                                  config.json is that file as the Hub ships it (sizes scaled
                                  down, every other field and the key order kept);
      OUT_ROOT/NAME/reference/    reference.safetensors + reference.json (the bundle below);
      OUT_ROOT/NAME/.done         a stamp of the generator parameters (see "Idempotent").

    Variants come from tools/refgen/families/ (one module per family). The weights are chosen so
    that adapter bugs show:
      * rope_theta is 50000 in the hand-written configs, not the 10000 default;
      * norm weights are drawn from U(0.5, 1.5) (Gemma: w from U(-0.5, 0.5) for x * (1 + w)), so
        a skipped norm shows;
      * weights have O(1) activations (std 1/sqrt(fan_in)), so logits are far from uniform;
      * tied models get small embeddings (std TIED_EMBED_STD) and a final norm gain
        (TIED_FINAL_NORM_GAIN): with N(0, 0.5) embeddings the input token's own embedding
        dominates the residual stream and a tied model repeats one token forever, which hides
        decode-path bugs; the small embeddings also make the first norm's input small enough
        (mean square ~4e-4) that rms_norm_eps changes its output;
      * one probe prompt is 300 tokens long, because RoPE and window bugs barely show at short
        positions;
      * every greedy continuation must hold at least MIN_DISTINCT_TOKENS distinct tokens, else
        the variant is rejected (a repeated token lets a decode-only bug pass an id check).

Reference bundle (format gatehouse-reference/2; docs/protocols.md §6), for each prompt i:
      prompts.{i}.input_ids                 I64 [T]
      prompts.{i}.logits                    F32 [T, V]  one forward, fp32, eager attention
      prompts.{i}.greedy_ids                I64 [N]     generate(do_sample=False), new tokens
      prompts.{i}.decode_logits             F32 [N, V]  the logits generate chose each of those
                                                        tokens from (KV-cached decode steps)
      prompts.{i}.continuation_logits       F32 [N, V]  teacher-forced: one forward over the
                                                        prompt + greedy_ids[:N-1], the rows that
                                                        predict greedy_ids
      and the four after input_ids again with suffix _bf16 (logits_bf16, greedy_ids_bf16, ...):
      the checkpoint loaded with from_pretrained(dtype=bfloat16), computed in bf16.
    reference/reference.json:
      {"format": "gatehouse-reference/2", "num_prompts": N, "max_new_tokens": 32,
       "transformers": ver, "torch": ver, "model_type": ..., "seed": S, "device": "cpu",
       "cpu_capability": "AVX512", "num_threads": n,
       "continuation_distinct_tokens": {"fp32": [..], "bf16": [..]},
       "decode_floor": {"fp32": {"max_abs_diff", "kl_mean", "steps", "method"}, "bf16": ...},
       "training": {"steps", "lr", "seed", "optimizer", "batch", "fp32": TRACE, "bf16": TRACE}}
      TRACE = {"losses": [loss per step], "grad_norms": {checkpoint key: L2 norm of its
      gradient at step 1}, "grad_sums": {checkpoint key: sum of that gradient's elements (a
      sign-sensitive figure the norm is blind to)}, "trainable": [checkpoint keys upstream
      trains],
      "first_changed_step": {checkpoint key: the first step after which its weight differs
      from the checkpoint's, or null}, "floor": FLOOR}: upstream's AdamW steps on the probe
      prompts (step s trains on prompt (s-1) mod P: inputs ids[:-1], labels
      ids[1:], mean cross-entropy), gradients named as save_pretrained names the weights.
      FLOOR = {"implementations": [...], "grad_norm_rel": x, "loss_rel": [per step]}: upstream's
      own spread, the same trace made with its other implementations of the same math (MoE
      experts: eager and batched_mm beside grouped_mm; none for dense models).
      decode_floor: upstream's own spread between its dynamic and static KV caches.

Idempotent
    A variant is skipped when OUT_ROOT/NAME/.done holds exactly this generator's parameters
    (variant settings, seed, prompt lengths, script format version, transformers and torch
    versions). Otherwise it is rebuilt in a temporary folder and moved into place, so an
    interrupted run never leaves a half-written variant behind a valid stamp.

CLI
    python tools/refgen/make_checkpoint.py --out-root DIR [--only NAME ...]
"""

import argparse
import contextlib
import copy
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

# MKL (torch's CPU BLAS) picks code paths by the operands' memory alignment on some CPUs (AMD
# EPYC: 36 of 360 linear shapes differ in the last bits between a 64-byte-aligned weight and
# the same weight at a 4-byte offset). Conditional numerical reproducibility makes its results
# independent of alignment; the worker sets the same (worker_lib/src/cpu_reproducibility.cc),
# so upstream's run and ours stay comparable bit for bit (docs/bars.md). Read by MKL at its
# first call, so any time before the first matmul; a value already set is kept.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers.core_model_loading import revert_weight_conversion

# Bump when the output of this script changes for the same parameters.
GENERATOR_VERSION = 9
REFERENCE_FORMAT = "gatehouse-reference/2"
SEED = 20240611
MAX_NEW_TOKENS = 32
# Probe prompt lengths; the last one probes RoPE at long positions.
PROMPT_LENGTHS = [7, 33, 300]
# Tied models: embeddings N(0, TIED_EMBED_STD) and the final norm's weight times
# TIED_FINAL_NORM_GAIN (see "What" above).
TIED_EMBED_STD = 0.02
TIED_FINAL_NORM_GAIN = 8.0
# A greedy continuation with fewer distinct tokens is degenerate: the variant is rejected.
MIN_DISTINCT_TOKENS = 3
# The training trace: upstream's AdamW (torch defaults: betas (0.9, 0.999), eps 1e-8,
# weight_decay 0.01) for TRAIN_STEPS steps at TRAIN_LR; the cell defaults (run_spec.h) are
# 2 steps, lr 1e-3, seed 1234, so a default cell compares every step it runs.
TRAIN_STEPS = 4
TRAIN_LR = 1e-3
TRAIN_SEED = 1234

HERE = Path(__file__).resolve().parent
HUB_CONFIG_DIR = HERE / "hub_configs"

# Variants come from one module per family in tools/refgen/families/ (a dict VARIANTS of
# name -> families.Variant); adding a family adds a module there.
sys.path.insert(0, str(HERE))
from families import all_variants  # noqa: E402
from memory import bound_heap, return_freed_memory  # noqa: E402
from offloaded_adamw import OffloadedAdamW  # noqa: E402

VARIANTS = all_variants()


def generator_params(name):
    """Everything that determines a variant's files; stored in the .done stamp."""
    variant = VARIANTS[name]
    params = {
        "generator_version": GENERATOR_VERSION,
        "name": name,
        "variant": variant.stamp(),
        "seed": SEED,
        "prompt_lengths": PROMPT_LENGTHS,
        "max_new_tokens": MAX_NEW_TOKENS,
        "tied_init": [TIED_EMBED_STD, TIED_FINAL_NORM_GAIN],
        "training": [TRAIN_STEPS, TRAIN_LR, TRAIN_SEED],
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
    }
    if variant.hub_config is not None:
        params["hub_config_text"] = (HUB_CONFIG_DIR / variant.hub_config).read_text()
    return params


def hub_config_json(variant):
    """The published config.json of a hub variant with its scaled fields replaced in place
    (same key order). A scaled field the file lacks is an error: scaling keeps the file's
    fields, it never adds one."""
    raw = json.loads((HUB_CONFIG_DIR / variant.hub_config).read_text())
    for key, value in variant.config.items():
        if key not in raw:
            raise RuntimeError(f"{variant.hub_config}: scaled field {key!r} is not in the file")
        raw[key] = value
    return raw


def variant_config(variant):
    """The transformers config of a variant, eager attention. A hub variant's config is read by
    AutoConfig.from_pretrained from its scaled config.json, as upstream reads a Hub download."""
    if variant.hub_config is None:
        # A copy: transformers fills nested dicts (rope_scaling) in place.
        return variant.config_class(**copy.deepcopy(variant.config), attn_implementation="eager")
    with tempfile.TemporaryDirectory(prefix="hubcfg-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(hub_config_json(variant), indent=2))
        config = transformers.AutoConfig.from_pretrained(tmp, attn_implementation="eager")
    if not isinstance(config, variant.config_class):
        raise RuntimeError(f"{variant.hub_config} reads as {type(config).__name__}, "
                           f"not {variant.config_class.__name__}")
    return config


def build_model(variant):
    """A fp32 *ForCausalLM of the variant's family with seeded weights chosen so that adapter
    bugs show."""
    torch.manual_seed(SEED if variant.seed is None else variant.seed)
    # Eager attention: the reference semantics (softmax in fp32 over explicit scores).
    config = variant_config(variant)
    model = variant.model_class(config).to(torch.float32)
    assert model.config._attn_implementation == "eager"
    tied = bool(model.config.tie_word_embeddings)
    embed_std = variant.embed_std if variant.embed_std is not None else (
        TIED_EMBED_STD if tied else 0.5)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                # Away from the identity: a missing norm must change logits. Norms computing
                # x * (1 + w) (Gemma) get w around 0, the others w around 1.
                param.uniform_(-0.5, 0.5) if variant.norm_offset_one else param.uniform_(0.5, 1.5)
                if tied and name == "model.norm.weight":
                    # Spreads the tied logits again (the small embeddings shrink them).
                    if variant.norm_offset_one:
                        param.copy_((1.0 + param) * TIED_FINAL_NORM_GAIN - 1.0)
                    else:
                        param.mul_(TIED_FINAL_NORM_GAIN)
            elif param.dim() == 2 and "embed_tokens" in name:
                param.normal_(0.0, embed_std)
            elif param.dim() == 2:
                param.normal_(0.0, param.shape[1] ** -0.5)  # unit-scale activations
            else:
                param.normal_(0.0, 0.1)  # biases, stacked experts
    model.eval()
    return model


def probe_prompts(vocab_size, lengths):
    """Prompt token ids from a fixed-seed generator, one tensor [T] per prompt."""
    gen = torch.Generator().manual_seed(SEED + 1)
    # Ids 0..2 are left out so no prompt contains the pad/bos/eos ids of the config.
    return [torch.randint(3, vocab_size, (n,), generator=gen, dtype=torch.int64) for n in lengths]


def greedy_config(model, cache_implementation=None, max_new_tokens=MAX_NEW_TOKENS):
    """Plain greedy, as the decode gate computes it: argmax at every step for exactly
    max_new_tokens tokens. No eos stop and no eos suppression (min_new_tokens would mask eos when
    it is the true argmax, and a fixture would then disagree with plain greedy). A fresh
    GenerationConfig, not the checkpoint's: see plain_generate."""
    gen_config = transformers.GenerationConfig()
    gen_config.update(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=[],
                      pad_token_id=0, output_logits=True, return_dict_in_generate=True,
                      cache_implementation=cache_implementation)
    return gen_config


def plain_generate(model, batch, generation_config):
    """model.generate(input_ids=batch, all-ones mask, generation_config) with nothing taken from
    the checkpoint's own generation_config.json. transformers fills every field the given config
    leaves unset (None) from model.generation_config, so a checkpoint's repetition_penalty,
    no_repeat_ngram_size, suppress_tokens, forced_eos_token_id or cache_implementation would
    otherwise turn plain greedy into something the decode gate does not compute (greedy ids that
    are not the argmax of their own decode logits)."""
    saved = model.generation_config
    model.generation_config = transformers.GenerationConfig()
    try:
        return model.generate(input_ids=batch, attention_mask=torch.ones_like(batch),
                              generation_config=generation_config)
    finally:
        model.generation_config = saved


def logit_spread(a, b):
    """(max abs diff, mean per-token KL(a || b) in nats) of two [N, V] logit tensors, as the
    gates compute them (softmax in float64, KL summed over the vocabulary)."""
    log_p = torch.log_softmax(a.double(), -1)
    log_q = torch.log_softmax(b.double(), -1)
    p = log_p.exp()
    kl = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p)).sum(-1)
    return (a - b).abs().max().item(), kl.mean().item()


@torch.no_grad()
def decode_floor(model, ids, new_ids, decode_logits, max_new_tokens=MAX_NEW_TOKENS):
    """Upstream's own spread between its two KV caches: generate with a static (preallocated,
    masked) cache against the dynamic one's decode logits, over the steps whose tokens agree.
    Runs on the model's device (ids, new_ids and decode_logits are CPU tensors).
    Returns (max abs diff, KL summed over those steps, steps)."""
    batch = ids.unsqueeze(0).to(model.device)
    out = plain_generate(model, batch, greedy_config(model, "static", max_new_tokens))
    static_ids = out.sequences[0, ids.numel():].cpu()
    static_logits = torch.stack([step[0] for step in out.logits]).to(torch.float32).cpu()
    agree = static_ids == new_ids
    # Step k's logits share the prefix when every token before k agreed.
    n = int(agree.long().cumprod(0).sum().item()) + 1
    n = min(n, new_ids.numel())
    max_abs, kl = logit_spread(decode_logits[:n], static_logits[:n])
    return max_abs, kl * n, n


@torch.no_grad()
def reference_run(model, ids, max_new_tokens=MAX_NEW_TOKENS):
    """Upstream on one prompt ids [T] (a CPU tensor; run on the model's device): (prompt logits
    [T, V], greedy ids [N], the decode steps' logits [N, V], the teacher-forced continuation
    logits [N, V]), logits as float32, all on the CPU."""
    batch = ids.unsqueeze(0).to(model.device)
    mask = torch.ones_like(batch)
    logits = model(input_ids=batch, attention_mask=mask).logits[0].to(torch.float32).cpu()
    out = plain_generate(model, batch, greedy_config(model, max_new_tokens=max_new_tokens))
    new_ids = out.sequences[0, ids.numel():].to(torch.int64).cpu()
    if new_ids.numel() != max_new_tokens:
        raise RuntimeError(f"generate made {new_ids.numel()} tokens, not {max_new_tokens}")
    decode_logits = torch.stack([step[0] for step in out.logits]).to(torch.float32).cpu()
    seq = out.sequences[0, :-1].unsqueeze(0)
    forced = model(input_ids=seq, attention_mask=torch.ones_like(seq)).logits[0]
    continuation = forced[ids.numel() - 1:].to(torch.float32).cpu()
    return logits, new_ids, decode_logits, continuation


def checkpoint_slices(model, name, tensor):
    """One parameter's `tensor` (its values, gradient or any tensor of its shape) as
    save_pretrained writes it: [(checkpoint key, tensor)], through transformers' own reversal
    of its load-time conversions (a fused MoE experts tensor becomes one tensor per expert and
    projection). Per parameter, so no caller holds every parameter's tensor at once
    (tests/reference/offloaded_adamw_test.py checks the keys and values against one whole
    save)."""
    return list(revert_weight_conversion(model, {name: tensor}).items())


def training_trace(checkpoint_dir, model_class, prompts, dtype, steps=TRAIN_STEPS, lr=TRAIN_LR,
                   seed=TRAIN_SEED, scratch_dir=None, **load_kwargs):
    """Upstream's training steps on the probe prompts (see the module docstring, TRACE), on the
    CPU. load_kwargs go to from_pretrained (e.g. another experts_implementation).

    Memory: torch.optim.AdamW's update inside the backward, one parameter slice at a time with
    its state in files (offloaded_adamw.py: the same numbers) under a temporary directory in
    scratch_dir (None: the system's). Each gradient is read (step 1's norm and sum per
    checkpoint key) and freed by its parameter's update as soon as it is complete, so the
    trace holds the model, the step's activations and one parameter's gradient, not a set of
    gradients and two more copies of the model."""
    model = model_class.from_pretrained(str(checkpoint_dir), dtype=dtype,
                                        attn_implementation="eager", **load_kwargs)
    model.train()
    torch.manual_seed(seed)
    usable = [p for p in prompts if p.numel() >= 2]
    named = list(model.named_parameters())
    params = [p for _, p in named]
    losses, grad_norms, grad_sums = [], {}, {}
    # Per checkpoint key, the first step after which it differs from the checkpoint (None: not
    # yet). Until its first change every element equals the checkpoint, so that step is the
    # first in which the step changed any element (a fused tensor's experts may first change
    # at different steps: counted per key).
    first_changed = {}
    with_grad = set()
    step = 0

    def read_gradient(i, p):
        with_grad.add(i)
        if step != 1:
            return
        # Whole-tensor float64 reductions, as the training gate computes ours: a fixture's gate
        # holds these bit for bit (a slice-wise sum would differ in the last bits). Step 1's
        # batch is the shortest prompt, so the float64 copy of the largest gradient comes
        # when the activations are smallest (docs/real-size.md).
        for key, g in checkpoint_slices(model, named[i][0], p.grad.detach()):
            g = g.to(torch.float64)
            grad_norms[key], grad_sums[key] = g.norm().item(), g.sum().item()
            del g

    def mark(i, p, changed):
        for key, c in checkpoint_slices(model, named[i][0], changed):
            if first_changed.get(key) is None:
                first_changed[key] = step if bool(c.any()) else None

    with tempfile.TemporaryDirectory(prefix="adamw-", dir=scratch_dir) as scratch:
        optimizer = OffloadedAdamW(params, scratch, lr=lr)
        with optimizer.in_backward(before_step=read_gradient, after=mark):
            for step in range(1, steps + 1):
                ids = usable[(step - 1) % len(usable)]
                logits = model(input_ids=ids[:-1].unsqueeze(0)).logits.to(torch.float32)
                loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)),
                                                         ids[1:])
                del logits
                loss.backward()
                losses.append(loss.item())
                if step == 1:
                    missing = [named[i][0] for i in range(len(named)) if i not in with_grad]
                    if missing:
                        raise RuntimeError("upstream left parameters without a gradient: "
                                           f"{missing[:5]}")
    for name, p in named:  # a key no step changed
        for key, _ in checkpoint_slices(model, name, p.detach()):
            first_changed.setdefault(key, None)
    return {"losses": losses, "grad_norms": dict(sorted(grad_norms.items())),
            "grad_sums": dict(sorted(grad_sums.items())),
            "trainable": sorted(grad_norms),
            "first_changed_step": dict(sorted(first_changed.items()))}


# Upstream's other implementations of the same math, whose spread against the default is the
# training floor (FLOOR in the module docstring): MoE experts as a plain loop and as batched
# matmuls beside the default grouped_mm. Dense models have no alternative: floor 0.
EXPERTS_IMPLEMENTATIONS = ("eager", "batched_mm")


def training_floor(checkpoint_dir, model_class, prompts, dtype, trace, steps=TRAIN_STEPS,
                   lr=TRAIN_LR, seed=TRAIN_SEED, scratch_dir=None):
    """Upstream's own spread in training: the trace made again with each other implementation,
    against `trace` (max relative step-1 gradient-norm difference over the keys, and max
    relative loss difference per step)."""
    config = transformers.AutoConfig.from_pretrained(str(checkpoint_dir))
    if not getattr(config, "num_experts", None):
        return {"implementations": [], "grad_norm_rel": 0.0, "loss_rel": [0.0] * steps}
    grad_rel, loss_rel = 0.0, [0.0] * steps
    for impl in EXPERTS_IMPLEMENTATIONS:
        alt = training_trace(checkpoint_dir, model_class, prompts, dtype, steps, lr, seed,
                             scratch_dir, experts_implementation=impl)
        for key, norm in trace["grad_norms"].items():
            grad_rel = max(grad_rel, abs(alt["grad_norms"][key] - norm) / abs(norm) if norm else 0.0)
        for i, (a, b) in enumerate(zip(alt["losses"], trace["losses"])):
            loss_rel[i] = max(loss_rel[i], abs(a - b) / abs(b))
    return {"implementations": [f"experts_implementation={i}" for i in EXPERTS_IMPLEMENTATIONS],
            "grad_norm_rel": grad_rel, "loss_rel": loss_rel}


class Stages:
    """Where a bundle's time and memory go: each stage's wall seconds and this process's peak
    RSS when it ended (reference.json "stages", the reference cell's figures). At the end of
    each stage the freed memory goes back to the system (gc, then glibc's malloc_trim: freed
    tensors otherwise stay in the allocator's arenas and count in every later stage's RSS)."""

    def __init__(self):
        self.records = []

    @contextlib.contextmanager
    def stage(self, name):
        t0 = time.monotonic()
        try:
            yield
        finally:
            return_freed_memory()
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
            self.records.append({"stage": name, "seconds": round(time.monotonic() - t0, 3),
                                 "peak_rss_bytes": peak})
            print(f"make_reference: {name} {time.monotonic() - t0:.1f} s, peak RSS "
                  f"{peak / 2**30:.2f} GiB", file=sys.stderr, flush=True)


def make_reference(model, checkpoint_dir, out_dir, prompts, describe=None, meta_extra=None,
                   min_distinct=MIN_DISTINCT_TOKENS, max_new_tokens=MAX_NEW_TOKENS,
                   train_steps=TRAIN_STEPS, train_lr=TRAIN_LR, train_seed=TRAIN_SEED,
                   release_model=False, envelope=False):
    """Writes reference.safetensors and reference.json (the bundle of the module docstring) for
    `model` (fp32, saved in checkpoint_dir) into out_dir.

    prompts: token id tensors [T] (int64, on the CPU). The forwards and decodes run on the
    model's device (the bf16 copy is moved there too); the training trace runs on the CPU.
    describe(i, new_ids) -> dict, when given, is stored as reference.json "prompts"[i] (e.g. the
    prompt text and upstream's decoded continuation, which the decode gate shows). meta_extra:
    more reference.json fields. A greedy continuation with fewer than min_distinct distinct
    tokens raises (None: no check). max_new_tokens, train_steps, train_lr, train_seed: the
    decode length and the training trace's AdamW steps, lr and seed (defaults: this module's
    MAX_NEW_TOKENS, TRAIN_STEPS, TRAIN_LR, TRAIN_SEED). release_model: free `model`'s weights
    (to_empty on the meta device) once the forwards are done, so the training traces, which load
    their own copies, do not run beside it; the caller must not use `model` afterwards.
    envelope: also measure the envelope of correct implementations (envelope.py) into
    reference.json "envelope", on the model's device, after the traces."""
    bound_heap()  # this process's freed tensors go back to the system (memory.py)
    device_type = next(model.parameters()).device.type
    tensors = {}
    described = []
    distinct = {"fp32": [], "bf16": []}
    # The bf16 reference: the checkpoint loaded as upstream loads it in bf16 (weights in bf16,
    # RoPE inv_freq buffers kept in fp32; a plain .to(bfloat16) would round those too), computed
    # in bf16. A bf16 cell is compared with this: bf16 rounding alone moves the top-1 of
    # near-tied logits.
    stages = Stages()
    with stages.stage("forwards"):
        model_bf16 = type(model).from_pretrained(
            str(checkpoint_dir), dtype=torch.bfloat16,
            attn_implementation="eager").to(model.device).eval()
        floor = {"fp32": [0.0, 0.0, 0], "bf16": [0.0, 0.0, 0]}  # max abs, KL sum, steps
        for i, ids in enumerate(prompts):
            tensors[f"prompts.{i}.input_ids"] = ids.contiguous()
            for precision, m, suffix in (("fp32", model, ""), ("bf16", model_bf16, "_bf16")):
                logits, new_ids, decode_logits, continuation = reference_run(m, ids,
                                                                             max_new_tokens)
                max_abs, kl_sum, steps = decode_floor(m, ids, new_ids, decode_logits,
                                                      max_new_tokens)
                acc = floor[precision]
                acc[0], acc[1], acc[2] = max(acc[0], max_abs), acc[1] + kl_sum, acc[2] + steps
                tensors[f"prompts.{i}.logits{suffix}"] = logits.contiguous()
                tensors[f"prompts.{i}.greedy_ids{suffix}"] = new_ids.contiguous()
                tensors[f"prompts.{i}.decode_logits{suffix}"] = decode_logits.contiguous()
                tensors[f"prompts.{i}.continuation_logits{suffix}"] = continuation.contiguous()
                distinct[precision].append(len(set(new_ids.tolist())))
                if precision == "fp32" and describe is not None:
                    described.append(describe(i, new_ids))
        # The forwards are done: neither model is needed by the training traces below, nor
        # are the bundle's tensors, which wait on disk beside out_dir (moved in at the end).
        del model_bf16, m, logits, new_ids, decode_logits, continuation
        if release_model:
            model.to_empty(device="meta")
        model_type = model.config.model_type
        tensors_path = out_dir.parent / f".{out_dir.name}.reference.safetensors.partial"
        save_file(tensors, str(tensors_path))
        del tensors
    try:
        if min_distinct is not None:
            bad = [f"{prec} prompt {i}: {n} distinct token(s)" for prec, counts in distinct.items()
                   for i, n in enumerate(counts) if n < min_distinct]
            if bad:
                raise RuntimeError("degenerate greedy continuation (a decode bug could hide behind a "
                                   f"repeated token; change the variant's seed or init): {bad}")
        training = {"steps": train_steps, "lr": train_lr, "seed": train_seed,
                    "optimizer": "torch.optim.AdamW(betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01)",
                    "batch": "step s: prompt (s-1) mod P; inputs ids[:-1], labels ids[1:], mean "
                             "cross-entropy over fp32 logits",
                    }
        for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            with stages.stage(f"training_{precision}"):
                trace = training_trace(checkpoint_dir, type(model), prompts, dtype, train_steps,
                                       train_lr, train_seed, scratch_dir=out_dir.parent)
                trace["floor"] = training_floor(checkpoint_dir, type(model), prompts, dtype, trace,
                                                train_steps, train_lr, train_seed, out_dir.parent)
            training[precision] = trace
        envelope_json = None
        if envelope:
            import envelope as envelope_module  # noqa: E402  (tools/refgen, on sys.path above)
            device = (torch.device(device_type, torch.cuda.current_device()) if device_type == "cuda"
                      else torch.device("cpu"))
            with stages.stage("envelope"):
                envelope_json = envelope_module.make_envelope(
                    type(model), checkpoint_dir, device,
                    [ids.contiguous() for ids in prompts],
                    envelope_module.runs_of(tensors_path, len(prompts)),
                    (train_steps, train_lr, train_seed), out_dir.parent)
        out_dir.mkdir(parents=True)
        os.replace(tensors_path, out_dir / "reference.safetensors")
        meta = {
            "format": REFERENCE_FORMAT,
            "num_prompts": len(prompts),
            "dtype": "float32",
            "max_new_tokens": max_new_tokens,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "model_type": model_type,
            "seed": SEED,
            # Where the forwards ran: bf16 near-ties move with the kernels, and the gates choose
            # their bars by the pair (bundle device, run device); on the CPU also by the kernel
            # family torch dispatched to.
            "device": device_type,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "num_threads": torch.get_num_threads(),
            "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
            "continuation_distinct_tokens": distinct,
            # KL is >= 0, but float64 rounding over near-identical logits can sum to -1e-17, which
            # the bundle reader refuses: clamped at 0 (a value >= 0 is written unchanged).
            "decode_floor": {
                precision: {"max_abs_diff": acc[0], "kl_mean": max(acc[1] / max(acc[2], 1), 0.0),
                            "steps": acc[2],
                            "method": "generate with cache_implementation='static' against the "
                                      "dynamic cache's decode_logits, over steps whose tokens agree"}
                for precision, acc in floor.items()},
            "training": training,
        }
        if describe is not None:
            meta["prompts"] = described
        if envelope_json is not None:
            meta["envelope"] = envelope_json
        meta["stages"] = stages.records
        meta.update(meta_extra or {})
        (out_dir / "reference.json").write_text(json.dumps(meta, indent=2) + "\n")
    finally:
        tensors_path.unlink(missing_ok=True)  # moved into out_dir, or left by a failure


def make_variant(out_root, name):
    """Builds OUT_ROOT/name unless its .done stamp already matches. Returns True if built."""
    params = generator_params(name)
    final = out_root / name
    stamp = final / ".done"
    if stamp.is_file():
        try:
            if json.loads(stamp.read_text()) == params:
                print(f"{name}: up to date", file=sys.stderr)
                return False
        except json.JSONDecodeError:
            pass  # a damaged stamp means rebuild

    tmp = out_root / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    variant = VARIANTS[name]
    model = build_model(variant)
    save_kwargs = {}
    if variant.max_shard_size is not None:
        save_kwargs["max_shard_size"] = variant.max_shard_size
    model.save_pretrained(str(tmp / "checkpoint"), **save_kwargs)
    if variant.hub_config is not None and variant.hub_form:
        # The config.json a Hub download holds, not save_pretrained's rewrite of it.
        (tmp / "checkpoint" / "config.json").write_text(
            json.dumps(hub_config_json(variant), indent=2) + "\n")
    if variant.max_shard_size is not None:
        shards = sorted((tmp / "checkpoint").glob("model-*.safetensors"))
        if len(shards) < 2 or not (tmp / "checkpoint" / "model.safetensors.index.json").is_file():
            raise RuntimeError(f"{name}: expected >= 2 shards and an index, got {[s.name for s in shards]}")
    prompts = probe_prompts(model.config.vocab_size, variant.prompt_lengths or PROMPT_LENGTHS)
    # Upstream as a user runs it: from_pretrained of the directory as written.
    upstream = variant.model_class.from_pretrained(str(tmp / "checkpoint"), dtype=torch.float32,
                                                   attn_implementation="eager").eval()
    try:
        make_reference(upstream, tmp / "checkpoint", tmp / "reference", prompts)
    except RuntimeError as e:
        raise RuntimeError(f"variant {name}: {e}") from e
    (tmp / ".done").write_text(json.dumps(params, indent=2, sort_keys=True) + "\n")

    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    print(f"{name}: written to {final}", file=sys.stderr)
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-root", required=True, type=Path, help="folder that receives one folder per variant")
    parser.add_argument("--only", nargs="+", choices=sorted(VARIANTS), metavar="NAME",
                        help=f"variants to make (default: all of {', '.join(VARIANTS)})")
    args = parser.parse_args(argv)
    args.out_root.mkdir(parents=True, exist_ok=True)
    for name in args.only or list(VARIANTS):
        make_variant(args.out_root, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
