"""The envelope of correct implementations: upstream's own spread under the choices a correct
adapter may make, measured on the checkpoint and probe prompts at hand.

What
    A correct adaptation computes upstream's function, but rarely in upstream's order of
    floating-point operations: training frameworks use scaled_dot_product_attention or flash
    kernels instead of an eager softmax, complex-number RoPE on interleaved pairs (torchtitan),
    fused QKV and gate/up projections (vLLM, Phi-3), a fused RMSNorm, another thread count. Each
    choice moves the logits, the decode steps and the training trace by rounding alone. This
    module runs transformers itself under each such variation (VARIATIONS) and records, per
    precision, how far each figure moved from the canonical run (eager attention, the
    bundle's): the envelope. A gate holds an adapter to a margin over it (docs/bars.md).

    Variations (each on a fresh from_pretrained copy; names are what the bundle records):
      attention=sdpa        attn_implementation="sdpa" (torch's scaled_dot_product_attention)
      rope=complex          RoPE as torchtitan computes it: the tables in fp32, each (i, i+d/2)
                            pair of the head made one complex number on interleaved pairs (the
                            layout torchtitan's permuted wq/wk hold), rotated by a complex
                            multiply in fp32 and cast back; q and k stay interleaved, so the
                            attention's dot products sum in that order
      projections=fused     q/k/v and gate/up projected by one GEMM over the concatenated
                            weights (vLLM's QKVParallelLinear / MergedColumnParallelLinear); a
                            checkpoint that ships them fused (Phi-3) is split instead
      norm=fused            RMSNorm as torch.nn.functional.rms_norm in fp32 with the weight
                            applied before the cast back (torch.nn.RMSNorm on fp32 activations)
      threads=N             another intra-op thread count (CPU only): reductions split apart
      combined              the first four together, as a framework's model makes them at once
    Not run, with the reason in the bundle: torch.compile (minutes of compilation per model on
    a CPU; the other variations already reorder what it fuses).

Figures per variation and precision, against the canonical run:
      prompt        the probe prompts' logits: max abs diff, mean per-token KL(canonical ||
                    variation) in nats (summed over the vocabulary, float64), top-1 agreement %
      decode_steps  KV-cached decode along upstream's greedy tokens: the same three figures
                    against the bundle's decode_logits
      training      upstream's AdamW trace (the bundle's batches, lr, seed and steps): relative
                    loss difference per step, and at step 1 the largest relative difference of
                    a parameter's gradient L2 norm and of its gradient sum (scaled by sqrt(numel)
                    x the norm, as the training gate scales it)
      logprobs      the rollout/training log-prob gap (the logprob_parity gate's): the
                    variation's KV-cached decode steps against its own teacher-forced forward
                    over the prompt and greedy ids ("self"), and against the canonical run's
                    ("cross", both ways): per decode row the expected |log p_forced - log
                    p_decode| of a token drawn at temperature 1 (mean_abs_diff, averaged over
                    rows) and the largest over every token (max_abs_diff), in nats
      packing       the packing gate's figures on upstream itself: the probe prompts packed into
                    one row (position_ids restarting; upstream masks across sequences) against
                    each prompt alone (max abs, KL mean and max, top-1 %), and the packed
                    training step against the unpacked batch's (loss_rel, and grad_rel: the
                    largest ||unpacked - packed|| / ||unpacked|| of a parameter's gradient;
                    the unpacked gradient is one backward over the sequences' summed loss)
    The envelope of a figure is its worst value over the variations, with the variation named;
    for logprobs and packing also over the canonical run itself ("canonical": upstream's own
    gap between its decode and its forward, its own packed-vs-alone spread). Packing is not
    measured where upstream's packed row is not its sequences alone by more than rounding
    (dynamic NTK RoPE scales by the row's longest position): "packing_not_run" says why.

Self-check
    The canonical path re-run through this module's own harness (decode steps fed one by one)
    must equal the bundle's figures exactly; its spread is recorded as "harness" and a nonzero
    one is named in the envelope ("harness_exact": false), because it would widen every bar by
    a difference no adapter made.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from safetensors import safe_open
from safetensors.torch import save_file

from memory import bound_heap, float64_norm_and_sum, return_freed_memory
from offloaded_adamw import OffloadedAdamW, post_accumulate_grad

ATTENTION_SDPA = "attention=sdpa"
ROPE_COMPLEX = "rope=complex"
PROJECTIONS_FUSED = "projections=fused"
NORM_FUSED = "norm=fused"
COMBINED = "combined"
FORMULATIONS = (ROPE_COMPLEX, PROJECTIONS_FUSED, NORM_FUSED)
# Bump when what the envelope measures changes: a bundle holding an older one is measured again.
ENVELOPE_VERSION = 2
NOT_RUN = [{"variation": "torch.compile",
            "why": "minutes of compilation per model on a CPU; the variations run reorder the "
                   "same operations compile fuses"}]


def log(msg):
    print(f"envelope: {msg}", file=sys.stderr, flush=True)


# --- comparisons (the gates' reductions: docs/gate-facts.md "Comparing logits") -------------

class Spread:
    """Accumulates the comparison of [N, V] logit rows: max abs diff, KL(ref || ours) summed over
    the vocabulary and averaged over rows (float64), top-1 agreement."""

    def __init__(self):
        self.max_abs, self.kl_sum, self.kl_max, self.agree, self.rows = 0.0, 0.0, 0.0, 0, 0

    ROWS_PER_SLICE = 32  # float64 softmaxes of 32 rows at a time, not of a whole prompt

    def add(self, ref, ours):
        for lo in range(0, ref.shape[0], self.ROWS_PER_SLICE):
            self._add(ref[lo:lo + self.ROWS_PER_SLICE], ours[lo:lo + self.ROWS_PER_SLICE])

    def _add(self, ref, ours):
        ref, ours = ref.to(torch.float32), ours.to(torch.float32)
        self.max_abs = max(self.max_abs, (ref - ours).abs().max().item())
        log_p = torch.log_softmax(ref.double(), -1)
        log_q = torch.log_softmax(ours.double(), -1)
        kl = (log_p.exp() * (log_p - log_q)).sum(-1).clamp_min(0.0)
        self.kl_sum += kl.sum().item()
        self.kl_max = max(self.kl_max, kl.max().item())
        self.agree += int((ref.argmax(-1) == ours.argmax(-1)).sum().item())
        self.rows += ref.shape[0]

    def figures(self):
        return {"max_abs_diff": self.max_abs,
                "kl_mean": self.kl_sum / max(self.rows, 1),
                "kl_max": self.kl_max,
                "top1_percent": 100.0 * self.agree / max(self.rows, 1),
                "rows": self.rows}


# --- the variations ------------------------------------------------------------------------

def _model_module(model):
    return sys.modules[type(model).__module__]


def _rms_norms(model):
    return [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]


def _norm_eps(m):
    for name in ("variance_epsilon", "eps"):
        v = getattr(m, name, None)
        if isinstance(v, float):
            return v
    raise RuntimeError(f"{type(m).__name__} has no eps attribute")


def _gemma_style(m):
    """Gemma's norms compute x * (1 + w) (their weight is stored around 0)."""
    return type(m).__name__.startswith("Gemma")


@contextlib.contextmanager
def norm_fused(model):
    """Every *RMSNorm of the model as F.rms_norm in fp32 with the weight (1 + w for Gemma)
    applied before the cast back."""
    norms = _rms_norms(model)
    if not norms:
        raise RuntimeError("no *RMSNorm module to replace")
    for m in norms:
        eps, gemma = _norm_eps(m), _gemma_style(m)

        def forward(x, m=m, eps=eps, gemma=gemma):
            w = m.weight.float()
            w = 1.0 + w if gemma else w
            return F.rms_norm(x.float(), (x.shape[-1],), w, eps).to(x.dtype)
        m.forward = forward
    try:
        yield len(norms)
    finally:
        for m in norms:
            del m.forward


def _rotate_complex(x, cos, sin):
    """x [..., D] with rotate-half pairs (i, i + r/2) over the first r = cos.shape[-1] dims; cos,
    sin fp32 [..., r] (broadcastable). Returns the rotated head in x's dtype with the rotated
    pairs interleaved (re0, im0, re1, im1, ...) and the rest of the head after them."""
    r = cos.shape[-1]
    half = r // 2
    rot, rest = x[..., :r], x[..., r:]
    pairs = torch.stack((rot[..., :half], rot[..., half:]), dim=-1).float()  # [..., r/2, 2]
    freqs = torch.complex(cos[..., :half].float(), sin[..., :half].float())
    out = torch.view_as_real(torch.view_as_complex(pairs.contiguous()) * freqs).flatten(-2)
    return torch.cat((out.to(x.dtype), rest), dim=-1)


@contextlib.contextmanager
def rope_complex(model):
    """The model module's apply_rotary_pos_emb replaced by _rotate_complex, and its rotary
    embedding modules made to return fp32 tables (torchtitan's freqs_cis are fp32)."""
    module = _model_module(model)
    if not hasattr(module, "apply_rotary_pos_emb"):
        raise RuntimeError(f"{module.__name__} has no apply_rotary_pos_emb")
    original = module.apply_rotary_pos_emb

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1, **_):
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return _rotate_complex(q, cos, sin), _rotate_complex(k, cos, sin)

    rotaries = [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]
    for m in rotaries:
        def forward(x, *a, m=m, **kw):
            return type(m).forward(m, x.float(), *a, **kw)
        m.forward = forward
    module.apply_rotary_pos_emb = apply_rotary_pos_emb
    try:
        yield len(rotaries)
    finally:
        module.apply_rotary_pos_emb = original
        for m in rotaries:
            del m.forward


class _FusedGroup:
    """Linears that read the same input computed by one GEMM over their concatenated weights:
    the first member's call computes all, the others take their slice (a member called on
    another input computes its own)."""

    def __init__(self, linears):
        self.linears = linears
        self.pending = None  # (input, outputs)
        self.unfused = 0     # member calls on another input than the first member's

    def _fused(self, x):
        weight = torch.cat([l.weight for l in self.linears])
        biases = [l.bias for l in self.linears]
        if any(b is None for b in biases) and any(b is not None for b in biases):
            raise RuntimeError("fused projections with and without bias")
        bias = torch.cat(biases) if biases[0] is not None else None
        return F.linear(x, weight, bias)

    def call(self, i, x):
        if i == 0:
            # Under autograd the concatenated weight is made again in the backward instead of
            # being saved (activation checkpointing of this GEMM: the same operations, so the
            # same gradients): saved, every layer's copy of its projection weights would live
            # until the backward, 1.4 GB more for a 0.5B model in fp32.
            y = (checkpoint(self._fused, x, use_reentrant=False) if torch.is_grad_enabled()
                 else self._fused(x))
            self.pending = (x, y.split([l.out_features for l in self.linears], dim=-1))
        elif self.pending is None or self.pending[0] is not x:
            self.unfused += 1
            return F.linear(x, self.linears[i].weight, self.linears[i].bias)
        out = self.pending[1][i]
        if i == len(self.linears) - 1:
            self.pending = None
        return out


def _split_call(linear, sizes):
    def forward(x):
        ws = linear.weight.split(sizes)
        bs = linear.bias.split(sizes) if linear.bias is not None else [None] * len(sizes)
        return torch.cat([F.linear(x, w, b) for w, b in zip(ws, bs)], dim=-1)
    return forward


@contextlib.contextmanager
def projections_fused(model):
    """q/k/v and gate/up fused into one GEMM each; already fused ones (qkv_proj, gate_up_proj)
    split into their parts."""
    config = model.config
    patched, groups, patched_groups = [], 0, []
    for m in model.modules():
        children = dict(m.named_children())
        for names in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
            if all(isinstance(children.get(n), torch.nn.Linear) for n in names):
                group = _FusedGroup([children[n] for n in names])
                patched_groups.append(group)
                for i, n in enumerate(names):
                    children[n].forward = (lambda x, g=group, i=i: g.call(i, x))
                    patched.append(children[n])
                groups += 1
        qkv = children.get("qkv_proj")
        if isinstance(qkv, torch.nn.Linear):
            head_dim = getattr(m, "head_dim", None) or config.hidden_size // config.num_attention_heads
            q = config.num_attention_heads * head_dim
            kv = config.num_key_value_heads * head_dim
            qkv.forward = _split_call(qkv, [q, kv, kv])
            patched.append(qkv)
            groups += 1
        gate_up = children.get("gate_up_proj")
        if isinstance(gate_up, torch.nn.Linear):
            gate_up.forward = _split_call(gate_up, [gate_up.out_features // 2] * 2)
            patched.append(gate_up)
            groups += 1
    if not groups:
        raise RuntimeError("no projection to fuse or split")
    record = {"groups": groups, "unfused_calls": 0}
    try:
        yield record
    finally:
        # A member called on another input than its group's first computed alone: a count
        # above 0 means the variation did not fuse every call (recorded, never hidden).
        record["unfused_calls"] = sum(g.unfused for g in patched_groups)
        for linear in patched:
            del linear.forward


@contextlib.contextmanager
def threads(n):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)


def other_thread_count(n):
    """The thread count a variation runs at: half the bundle's, or 2 when it used one."""
    return max(1, n // 2) if n > 1 else 2


def variation_names(device_type, num_threads):
    names = [ATTENTION_SDPA, *FORMULATIONS]
    if device_type == "cpu":
        names.append(f"threads={other_thread_count(num_threads)}")
    names.append(COMBINED)
    return names


@contextlib.contextmanager
def applied(name, model):
    """The variation `name` applied to `model` (attention=sdpa is chosen at load, see
    load_for); yields what it changed, for the record."""
    with contextlib.ExitStack() as stack:
        changed = {}
        if name in (ROPE_COMPLEX, COMBINED):
            changed["rotary_modules"] = stack.enter_context(rope_complex(model))
        if name in (PROJECTIONS_FUSED, COMBINED):
            changed["projection_groups"] = stack.enter_context(projections_fused(model))
        if name in (NORM_FUSED, COMBINED):
            changed["norms"] = stack.enter_context(norm_fused(model))
        if name.startswith("threads="):
            changed["threads"] = stack.enter_context(threads(int(name.split("=", 1)[1])))
        yield changed


def attention_of(name):
    return "sdpa" if name in (ATTENTION_SDPA, COMBINED) else "eager"


# --- the measurements -----------------------------------------------------------------------

@torch.no_grad()
def cached_decode_steps(model, ids, forced):
    """Upstream's KV-cached decode fed `forced` [N] after the prompt ids [T]: the [N, V] float32
    logits each step predicts from (row k predicts forced[k]), on the CPU."""
    device = next(model.parameters()).device
    # generate() asks the prefill for the last position's logits only (logits_to_keep=1): the
    # head's GEMM over one row rounds differently from the same row of a [T, V] product.
    keep = {"logits_to_keep": 1} if model._supports_logits_to_keep() else {}
    out = model(input_ids=ids.unsqueeze(0).to(device), use_cache=True, **keep)
    rows = [out.logits[0, -1].to(torch.float32).cpu()]
    cache = out.past_key_values
    for k in range(forced.numel() - 1):
        out = model(input_ids=forced[k].view(1, 1).to(device), past_key_values=cache,
                    use_cache=True)
        cache = out.past_key_values
        rows.append(out.logits[0, -1].to(torch.float32).cpu())
    return torch.stack(rows)


@torch.no_grad()
def forced_rows(model, ids, forced):
    """Upstream's teacher-forced forward over the prompt ids [T] and forced[:-1]: the [N, V]
    float32 logits (on the CPU) of the columns that predict forced [N], as a trainer scores a
    rollout's tokens."""
    device = next(model.parameters()).device
    seq = torch.cat([ids, forced[:-1]]).unsqueeze(0).to(device)
    logits = model(input_ids=seq, use_cache=False).logits[0]
    return logits[ids.numel() - 1:].to(torch.float32).cpu()


@torch.no_grad()
def logits_figures(model, prompts, runs):
    """(prompt Spread, decode-steps Spread, rows) of `model` against the bundle's `runs`
    [(logits, greedy_ids, decode_logits)] per prompt; rows: per prompt the model's own (prompt
    logits [T, V], decode-step logits [N, V], teacher-forced logits [N, V]) along the greedy
    ids, float32 on the CPU."""
    device = next(model.parameters()).device
    prompt, steps, rows = Spread(), Spread(), []
    for ids, (logits, greedy, decode_logits) in zip(prompts, runs):
        ours = model(input_ids=ids.unsqueeze(0).to(device)).logits[0].to(torch.float32).cpu()
        decoded = cached_decode_steps(model, ids, greedy)
        prompt.add(logits, ours)
        steps.add(decode_logits, decoded)
        rows.append((ours, decoded, forced_rows(model, ids, greedy)))
    return prompt, steps, rows


class Lazy:
    """A sequence of n items made as they are asked for: item i is make(i)."""

    def __init__(self, n, make):
        self.n, self.make = n, make

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.make(i)


def rows_on_disk(rows, path):
    """logits_figures' rows written to a safetensors file at path, as a Lazy sequence that
    reads one prompt's (prompt logits, decode-step logits, teacher-forced logits) at a time:
    the rows of a 150k-word vocabulary are 0.3 GB per precision, held across every
    variation."""
    save_file({f"{i}.{k}": t.contiguous() for i, row in enumerate(rows)
               for k, t in zip(("prompt", "decoded", "forced"), row)}, str(path))

    def read(i):
        with safe_open(str(path), framework="pt") as f:
            return tuple(f.get_tensor(f"{i}.{k}") for k in ("prompt", "decoded", "forced"))
    return Lazy(len(rows), read)


class LogprobGap:
    """Rollout against training log-probs of one pair of paths, as the logprob_parity gate
    compares them (log_softmax of float32 logits, differences in float64): per decode row, the
    expected |log p_forced - log p_decode| of a token drawn from the decode row at temperature 1
    (what the gate's mean over sampled tokens estimates), and the largest over every token of
    the vocabulary (any token a sampler can draw)."""

    def __init__(self):
        self.expected_sum, self.max_abs, self.rows = 0.0, 0.0, 0

    def add(self, decode, forced):
        lp_decode = torch.log_softmax(decode.to(torch.float32), -1).double()
        lp_forced = torch.log_softmax(forced.to(torch.float32), -1).double()
        d = (lp_forced - lp_decode).abs()
        self.expected_sum += (lp_decode.exp() * d).sum().item()
        self.max_abs = max(self.max_abs, d.max().item())
        self.rows += decode.shape[0]

    def figures(self):
        return {"mean_abs_diff": self.expected_sum / max(self.rows, 1),
                "max_abs_diff": self.max_abs, "rows": self.rows}


def logprob_figures(rows, canonical_own):
    """{"self": the variation's decode against its own forced forward, "cross": its decode
    against the canonical forced forward and the canonical decode against its forced forward,
    the worse of the two} (LogprobGap figures) from logits_figures rows."""
    own, cross_a, cross_b = LogprobGap(), LogprobGap(), LogprobGap()
    for (_, decoded, forced), (_, c_decoded, c_forced) in zip(rows, canonical_own):
        own.add(decoded, forced)
        cross_a.add(decoded, c_forced)
        cross_b.add(c_decoded, forced)
    a, b = cross_a.figures(), cross_b.figures()
    cross = {k: max(a[k], b[k]) for k in ("mean_abs_diff", "max_abs_diff")}
    cross["rows"] = a["rows"]
    return {"self": own.figures(), "cross": cross}


def _packed_inputs(seqs, device):
    """One row of the sequences [T_i] end to end with positions restarting at each (upstream
    detects the packing from position_ids and masks across sequences), and the bounds."""
    bounds = [0]
    for s in seqs:
        bounds.append(bounds[-1] + s.numel())
    row = torch.cat(seqs).unsqueeze(0).to(device)
    positions = torch.cat([torch.arange(s.numel()) for s in seqs]).unsqueeze(0).to(device)
    return row, positions, bounds


def packing_not_measurable(config):
    """Why upstream's packed forward is not its unpacked one by more than rounding for this
    model, or None. Dynamic NTK RoPE scales every position by the longest in the forward: in a
    packed row that is the row's longest sequence, alone each sequence's own length, so
    upstream's packed-vs-alone spread there is its semantics, not a bound for a correct
    packing (the packing gate keeps its fixed bars)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for field in ("rope_parameters", "rope_scaling"):
        rope = getattr(config, field, None)
        if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) == "dynamic":
            return ("dynamic NTK RoPE: upstream scales by the longest position in the forward, "
                    "so its packed row is not its sequences alone")
    return None


GRADIENT_FILE_SLICE_ELEMENTS = 1 << 24  # 64 MiB of fp32 per read of a gradient file


def _slices(tensor, slice_elements=GRADIENT_FILE_SLICE_ELEMENTS):
    """(lo, slice) of the flattened tensor, slice_elements at a time."""
    flat = tensor.detach().reshape(-1)
    for lo in range(0, flat.numel(), slice_elements):
        yield lo, flat[lo:lo + slice_elements]


def _read_slice(f, like, lo):
    """like.numel() elements of like's dtype at element offset lo of file f, on like's device."""
    buf = torch.empty(like.numel(), dtype=like.dtype)
    f.seek(lo * buf.element_size())
    f.readinto(memoryview(buf.view(torch.uint8).numpy()))
    return buf.to(like.device)


def _accumulate_into_file(path, tensor):
    """The file at path (raw bytes of a tensor of tensor's shape and dtype) += tensor, a slice
    at a time; a missing file starts as tensor. The same fp32 additions, in the same order, as
    autograd's accumulation of .grad over successive backwards."""
    exists = os.path.exists(path)
    with open(path, "r+b" if exists else "w+b") as f:
        for lo, part in _slices(tensor):
            if exists:
                part = _read_slice(f, part, lo).add_(part)
            f.seek(lo * part.element_size())
            f.write(memoryview(part.contiguous().cpu().view(torch.uint8).numpy()))


def _norms_against_file(path, tensor):
    """(||file||, ||file - tensor||), L2 in float64, of the tensor _accumulate_into_file left at
    path and a same-shaped tensor, the difference taken in the tensor's dtype as an in-place
    gradient update would, a slice at a time."""
    own, diff = 0.0, 0.0
    with open(path, "rb") as f:
        for lo, part in _slices(tensor):
            kept = _read_slice(f, part, lo)
            own += kept.double().square().sum().item()
            diff += (kept - part).double().square().sum().item()
    return math.sqrt(own), math.sqrt(diff)


def packing_figures(model, prompts, alone_rows, scratch_dir=None):
    """Upstream's packed forward and training step against its own unpacked ones, as the
    packing gate compares ours (docs/bars.md "Packed batches"): the probe prompts packed into
    one row against each prompt's own forward (alone_rows, [T, V] float32 per prompt) as a
    Spread's figures; and the packed training step's mean cross-entropy and step gradients
    against the unpacked batch's (each sequence's summed loss over the batch's predicted
    tokens, accumulated over one backward per sequence): relative loss difference and the
    largest relative L2 difference of a parameter's gradient, ||unpacked - packed|| /
    ||unpacked||.

    Memory: each parameter's unpacked gradient is accumulated in a file in scratch_dir (None:
    the system's temporary directory) as soon as each backward completes it, and compared
    slice by slice as the packed step's arrives, so no whole set of gradients is held, and one
    sequence's graph at a time."""
    device = next(model.parameters()).device
    with torch.no_grad():
        row, positions, bounds = _packed_inputs(prompts, device)
        packed = model(input_ids=row, position_ids=positions, use_cache=False).logits[0]
        packed = packed.to(torch.float32).cpu()
    spread = Spread()
    for i, alone in enumerate(alone_rows):
        spread.add(alone, packed[bounds[i]:bounds[i + 1]])
    del packed

    usable = [p for p in prompts if p.numel() >= 2]
    inputs = [p[:-1] for p in usable]
    labels = [p[1:] for p in usable]
    predicted = sum(x.numel() for x in labels)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    model.train()
    for _, p in named:
        p.grad = None
    # The unpacked batch's gradient, accumulated over one backward per sequence in a file per
    # parameter (not in memory), then compared with the packed step's as its gradients arrive.
    grad_rel, worst = 0.0, ""
    with tempfile.TemporaryDirectory(prefix="packing-", dir=scratch_dir) as tmp:
        names = {id(p): n for n, p in named}

        def path(p):
            return os.path.join(tmp, names[id(p)])

        def accumulate_unpacked(p):
            _accumulate_into_file(path(p), p.grad)
            p.grad = None

        def compare_packed(p):
            nonlocal grad_rel, worst
            if os.path.exists(path(p)):
                norm, diff = _norms_against_file(path(p), p.grad)
            else:  # no unpacked gradient
                norm, diff = 0.0, float64_norm_and_sum(p.grad)[0]
            rel = diff / norm if norm else (0.0 if diff == 0 else math.inf)
            if rel > grad_rel or not worst:
                grad_rel, worst = rel, names[id(p)]
            p.grad = None

        with post_accumulate_grad([p for _, p in named], accumulate_unpacked):
            unpacked = 0.0
            for x, y in zip(inputs, labels):
                logits = model(input_ids=x.unsqueeze(0).to(device), use_cache=False).logits[0]
                loss = F.cross_entropy(logits.float(), y.to(device), reduction="sum") / predicted
                del logits
                loss.backward()
                unpacked += loss.item()
                del loss
        with post_accumulate_grad([p for _, p in named], compare_packed):
            row, positions, _ = _packed_inputs(inputs, device)
            logits = model(input_ids=row, position_ids=positions, use_cache=False).logits[0]
            packed_loss = F.cross_entropy(logits.float(), torch.cat(labels).to(device))
            del logits
            packed_loss.backward()
    model.eval()
    figures = spread.figures()
    figures.update({"loss_rel": abs(packed_loss.item() - unpacked) / abs(unpacked),
                    "grad_rel": grad_rel, "grad_rel_key": worst})
    return figures


def training_stats(model, prompts, steps, lr, seed, scratch_dir=None):
    """Upstream's AdamW trace as make_checkpoint.training_trace runs it (torch.optim.AdamW's
    update inside the backward, one parameter slice at a time, its state in files under
    scratch_dir: offloaded_adamw.py), keyed by parameter name: (losses, {name: step-1 grad L2
    norm}, {name: step-1 grad sum}, {name: numel})."""
    model.train()
    torch.manual_seed(seed)
    usable = [p for p in prompts if p.numel() >= 2]
    losses, norms, sums, numel = [], {}, {}, {}
    device = next(model.parameters()).device
    named = list(model.named_parameters())
    step = 0

    def read_gradient(i, p):
        if step == 1:
            name = named[i][0]
            norms[name], sums[name] = float64_norm_and_sum(p.grad)
            numel[name] = p.grad.numel()

    with tempfile.TemporaryDirectory(prefix="adamw-", dir=scratch_dir) as scratch:
        optimizer = OffloadedAdamW([p for _, p in named], scratch, lr=lr)
        with optimizer.in_backward(before_step=read_gradient):
            for step in range(1, steps + 1):
                ids = usable[(step - 1) % len(usable)].to(device)
                logits = model(input_ids=ids[:-1].unsqueeze(0)).logits.to(torch.float32)
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), ids[1:])
                del logits
                loss.backward()
                losses.append(loss.item())
    model.eval()
    return losses, norms, sums, numel


def training_spread(ref, ours):
    """Relative spread of training_stats `ours` against `ref`."""
    ref_losses, ref_norms, ref_sums, numel = ref
    losses, norms, sums, _ = ours
    loss_rel = [abs(a - b) / abs(b) if b else abs(a - b) for a, b in zip(losses, ref_losses)]
    grad_rel, sum_rel, worst = 0.0, 0.0, ""
    for name, want in ref_norms.items():
        got = norms.get(name)
        if got is None:
            raise RuntimeError(f"variation left {name} without a gradient")
        rel = abs(got - want) / want if want else abs(got - want)
        if rel > grad_rel or not worst:
            grad_rel, worst = rel, name
        scale = math.sqrt(numel[name]) * want
        d = abs(sums[name] - ref_sums[name])
        sum_rel = max(sum_rel, d / scale if scale > 0 else d)
    return {"loss_rel": loss_rel, "first_loss_rel": loss_rel[0] if loss_rel else 0.0,
            "grad_norm_rel": grad_rel, "grad_norm_worst_key": worst, "grad_sum_rel": sum_rel}


def _worst(by_variation, section, figure, larger_is_worse=True):
    """(worst value, its variation) of by_variation[v][section][figure] over v (section None:
    by_variation[v][figure])."""
    pick = max if larger_is_worse else min

    def value(v):
        entry = by_variation[v]
        return (entry if section is None else entry[section])[figure]
    name = pick(by_variation, key=value)
    return value(name), name


def summarize(by_variation, canonical_logprobs, canonical_packing):
    """The envelope: every figure's worst value over the variations, with its variation; for
    log-probs and packing also over upstream's canonical run itself ("canonical"), whose own
    rollout/training gap and packed/unpacked spread a correct adapter shows as well."""
    out = {}
    for section in ("prompt", "decode_steps"):
        s = {}
        for figure in ("max_abs_diff", "kl_mean", "kl_max"):
            s[figure], s[figure + "_from"] = _worst(by_variation, section, figure)
        s["top1_percent"], s["top1_percent_from"] = _worst(by_variation, section, "top1_percent",
                                                           larger_is_worse=False)
        out[section] = s
    t = {}
    for figure in ("first_loss_rel", "grad_norm_rel", "grad_sum_rel"):
        t[figure], t[figure + "_from"] = _worst(by_variation, "training", figure)
    steps = len(next(iter(by_variation.values()))["training"]["loss_rel"])
    t["loss_rel"] = [max(v["training"]["loss_rel"][i] for v in by_variation.values())
                     for i in range(steps)]
    out["training"] = t
    # Log-probs: each variation's own gap and its gaps against the canonical paths.
    candidates = {"canonical": canonical_logprobs}
    for name, v in by_variation.items():
        candidates[name] = v["logprobs"]["self"]
        candidates[name + " against canonical"] = v["logprobs"]["cross"]
    lp = {}
    for figure in ("mean_abs_diff", "max_abs_diff"):
        lp[figure], lp[figure + "_from"] = _worst(candidates, None, figure)
    out["logprobs"] = lp
    if canonical_packing is None:
        return out  # not measurable for this model (packing_not_measurable): no "packing"
    candidates = {"canonical": canonical_packing,
                  **{name: v["packing"] for name, v in by_variation.items()}}
    pk = {}
    for figure in ("max_abs_diff", "kl_mean", "kl_max", "loss_rel", "grad_rel"):
        pk[figure], pk[figure + "_from"] = _worst(candidates, None, figure)
    pk["top1_percent"], pk["top1_percent_from"] = _worst(candidates, None, "top1_percent",
                                                         larger_is_worse=False)
    out["packing"] = pk
    return out


def measure(model_class, checkpoint_dir, device, prompts, runs, training, precision,
            scratch_dir=None):
    """The envelope of one precision. runs: per prompt (logits, greedy_ids, decode_logits) of
    the bundle's run in this precision; training: (steps, lr, seed) of the trace. Variations
    are compared with the canonical path run here (the bundle's figures are reproduced exactly
    when this runs where the bundle was made: "harness")."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    steps, lr, seed = training

    def load(attention):
        return model_class.from_pretrained(str(checkpoint_dir), dtype=dtype,
                                           attn_implementation=attention).to(device).eval()

    with tempfile.TemporaryDirectory(prefix="envelope-", dir=scratch_dir) as tmp:
        model = load("eager")
        # The canonical path through this harness, against the bundle's own tensors
        # ("harness"), its rows kept on disk for the variations.
        harness_prompt, harness_steps, canonical_own = logits_figures(model, prompts, runs)
        canonical_own = rows_on_disk(canonical_own, Path(tmp) / "canonical.safetensors")
        greedy = [runs[i][1] for i in range(len(runs))]
        # The variations are compared with these (runs' layout: logits, greedy ids, decode
        # logits).
        def canonical_run(i):
            ours, decoded, _ = canonical_own[i]
            return ours, greedy[i], decoded
        canonical = Lazy(len(greedy), canonical_run)
        # Upstream's own rollout/training gap and packed/unpacked spread, before any variation.
        canonical_logprobs = logprob_figures(canonical_own, canonical_own)["self"]
        packing_why_not = packing_not_measurable(model.config)
        canonical_packing = (
            None if packing_why_not else
            packing_figures(model, prompts, Lazy(len(greedy), lambda i: canonical_own[i][0]),
                            tmp))
        canonical_training = training_stats(model, prompts, steps, lr, seed, tmp)
        del model
        return_freed_memory()

        by_variation, not_run = {}, []
        for name in variation_names(device.type, torch.get_num_threads()):
            t0 = time.monotonic()
            attention = attention_of(name)
            try:
                model = load(attention)
            except ValueError as e:
                # Upstream refuses the backend for this class (Gemma 2's soft-capping has no
                # SDPA path): not a variation a correct adapter of this model can make either.
                if attention == "eager":
                    raise
                why = (f"upstream refuses attn_implementation={attention!r}: "
                       f"{str(e).split('. ')[0]}")
                if name != COMBINED:
                    not_run.append({"variation": name, "why": why})
                    continue
                changed_attention = f"eager ({why})"
                model = load("eager")
            else:
                changed_attention = attention
            with applied(name, model) as changed:
                changed["attention"] = changed_attention
                prompt, decode, rows = logits_figures(model, prompts, canonical)
                rows = rows_on_disk(rows, Path(tmp) / f"{name}.safetensors")
                logprobs = logprob_figures(rows, canonical_own)
                packing = (None if packing_why_not else
                           packing_figures(model, prompts, Lazy(len(rows), lambda i: rows[i][0]),
                                           tmp))
                del rows
                trained = training_stats(model, prompts, steps, lr, seed, tmp)
            by_variation[name] = {"prompt": prompt.figures(), "decode_steps": decode.figures(),
                                  "training": training_spread(canonical_training, trained),
                                  "logprobs": logprobs, "packing": packing,
                                  "changed": changed, "seconds": time.monotonic() - t0}
            del model
            return_freed_memory()
            v = by_variation[name]
            log(f"{precision} {name}: prompt max abs {v['prompt']['max_abs_diff']:.3g}, "
                f"decode steps "
                f"{v['decode_steps']['max_abs_diff']:.3g}, grad norm rel "
                f"{v['training']['grad_norm_rel']:.3g}, log-prob gap mean "
                f"{v['logprobs']['cross']['mean_abs_diff']:.3g} max "
                f"{v['logprobs']['cross']['max_abs_diff']:.3g}, packed "
                + (f"max abs {v['packing']['max_abs_diff']:.3g} "
                   f"grad rel {v['packing']['grad_rel']:.3g}"
                   if v["packing"] else "not measured") + f" ({v['seconds']:.1f} s)")
    result = summarize(by_variation, canonical_logprobs, canonical_packing)
    result["canonical"] = {"logprobs": canonical_logprobs, "packing": canonical_packing}
    if packing_why_not:
        result["packing_not_run"] = packing_why_not
    result["by_variation"] = by_variation
    result["not_run"] = not_run
    result["harness"] = {"prompt": harness_prompt.figures(),
                         "decode_steps": harness_steps.figures()}
    result["harness_exact"] = (harness_prompt.max_abs == 0 and harness_steps.max_abs == 0)
    result["canonical_losses"] = canonical_training[0]
    return result


def make_envelope(model_class, checkpoint_dir, device, prompts, runs_by_precision, training,
                  scratch_dir=None):
    """reference.json "envelope" (docs/protocols.md §6): measure() for each precision of
    runs_by_precision ({"fp32": runs, "bf16": runs}), what was not run and why, and how long
    it took. Runs at this process's thread count: the bundle's, for the harness to be exact.
    scratch_dir: where the training traces keep their optimizer state (None: the system's
    temporary directory)."""
    t0 = time.monotonic()
    env = {"version": ENVELOPE_VERSION,
           "method": "transformers under each variation against its canonical eager run on the "
                     "bundle's prompts and training batches (tools/refgen/envelope.py)",
           "variations": variation_names(device.type, torch.get_num_threads()),
           "not_run": NOT_RUN}
    for precision, runs in runs_by_precision.items():
        env[precision] = measure(model_class, checkpoint_dir, device, prompts, runs, training,
                                 precision, scratch_dir)
    # What ran: a variation upstream refuses for this model is in the precisions' "not_run".
    env["variations"] = [v for v in env["variations"]
                         if any(v in env[p]["by_variation"] for p in runs_by_precision)]
    env["seconds"] = time.monotonic() - t0
    return env


class BundleRuns:
    """One precision's runs of a bundle's tensors file (reference.safetensors), read per prompt
    as they are asked for: item i is (logits [T, V], greedy_ids [N], decode_logits [N, V]) of
    prompt i, copied from the file, so a measurement holds one prompt's tensors, not the
    bundle's."""

    def __init__(self, path, num_prompts, suffix):
        self.path, self.num_prompts, self.suffix = str(path), num_prompts, suffix

    def __len__(self):
        return self.num_prompts

    def __getitem__(self, i):
        if not 0 <= i < self.num_prompts:
            raise IndexError(i)
        with safe_open(self.path, framework="pt") as f:
            return tuple(f.get_tensor(f"prompts.{i}.{name}{self.suffix}")
                         for name in ("logits", "greedy_ids", "decode_logits"))


def runs_of(path, num_prompts):
    """{"fp32": runs, "bf16": runs} (BundleRuns) of a bundle's tensors file."""
    return {precision: BundleRuns(path, num_prompts, suffix)
            for precision, suffix in (("fp32", ""), ("bf16", "_bf16"))}


def add_to_bundle(bundle_dir, checkpoint_dir, device="cpu", force=False):
    """Measures the envelope of the bundle in bundle_dir (made from checkpoint_dir) and writes
    it into its reference.json (a temporary file renamed into place: readers see the old file
    or the new one). Skipped when the bundle already holds this version's envelope, unless
    `force`. Returns True when written."""
    import json
    import os
    from pathlib import Path

    import transformers

    bundle_dir, checkpoint_dir = Path(bundle_dir), Path(checkpoint_dir)
    meta_path = bundle_dir / "reference.json"
    meta = json.loads(meta_path.read_text())
    if not force and meta.get("envelope", {}).get("version") == ENVELOPE_VERSION:
        log(f"{bundle_dir}: envelope up to date")
        return False
    bound_heap()  # this process's freed tensors go back to the system (memory.py)
    if meta.get("num_threads") and device == "cpu":
        torch.set_num_threads(int(meta["num_threads"]))
    tensors_path = bundle_dir / "reference.safetensors"
    with safe_open(str(tensors_path), framework="pt") as f:
        prompts = [f.get_tensor(f"prompts.{i}.input_ids") for i in range(meta["num_prompts"])]
    training = meta["training"]
    env = make_envelope(transformers.AutoModelForCausalLM, checkpoint_dir, torch.device(device),
                        prompts, runs_of(tensors_path, meta["num_prompts"]),
                        (training["steps"], training["lr"], training["seed"]), bundle_dir.parent)
    meta["envelope"] = env
    tmp = meta_path.with_name(f".reference.json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, meta_path)
    log(f"{bundle_dir}: envelope written ({env['seconds']:.1f} s)")
    return True


def main(argv=None):
    import argparse
    import os

    # As the bundle makers run: MKL's results independent of alignment (make_checkpoint.py).
    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
    ap = argparse.ArgumentParser(description="Adds the envelope of correct implementations to "
                                             "existing reference bundles.")
    ap.add_argument("--bundle", required=True, action="append",
                    help="a bundle directory (reference.json, reference.safetensors); repeat "
                         "with --checkpoint for several, measured one after the other")
    ap.add_argument("--checkpoint", required=True, action="append",
                    help="the checkpoint the --bundle at the same place was made from")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--force", action="store_true", help="measure again even when up to date")
    args = ap.parse_args(argv)
    if len(args.bundle) != len(args.checkpoint):
        ap.error(f"{len(args.bundle)} --bundle but {len(args.checkpoint)} --checkpoint")
    threads = torch.get_num_threads()
    for bundle, checkpoint in zip(args.bundle, args.checkpoint):
        add_to_bundle(bundle, checkpoint, args.device, args.force)
        torch.set_num_threads(threads)  # add_to_bundle runs at each bundle's own count
    return 0


if __name__ == "__main__":
    sys.exit(main())
