"""Rotary position embeddings, as transformers computes them (modeling_rope_utils.py and the
*RotaryEmbedding modules of modeling_llama.py / modeling_qwen3_moe.py, transformers 5.24).

Every expression below is upstream's, with the same Python value types, because the op order
decides the last bit: Python's ``scalar / tensor`` is ``tensor.reciprocal() * scalar`` (two
roundings), ``int * int64 tensor`` stays integer where ``float * int64 tensor`` goes to fp32,
and a single-ulp difference in one frequency moves bf16 logits. Config values are therefore
carried with the JSON value's own type (``rope_theta`` 50000.0 vs 100000, ``factor`` 2 vs 2.0).

inv_freq per rope type:
  default  1 / theta^(2i/d)
  linear   default / factor
  dynamic  NTK-aware: up to max_position_embeddings the default frequencies; beyond, the base
           grows with the sequence length seen (``seq_len = max(position) + 1``, a 0-d int64
           tensor, so the grown base is computed in fp32 tensor arithmetic as upstream's
           ``dynamic_rope_update`` does)
  llama3   Llama 3.1's smooth low/high frequency scaling around original_max_position_embeddings

inv_freq is fp32 and, for the init-time types, computed on the CPU (upstream computes it in
``__init__`` on the CPU and moves the buffer with the model); dynamic growth is computed on the
positions' device, as upstream. cos/sin are computed in fp32 and cast to the activations' dtype.

Dynamic RoPE differs from upstream in one respect: upstream's module is stateful (after a long
call it keeps the grown frequencies for later calls up to that length, until a call shorter than
max_position_embeddings resets them); this is stateless: each call (each sequence of a packed
call) uses its own longest position. For a forward over a whole sequence, and for step-by-step
decoding where the length grows by one per call, both give the same frequencies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from gatehouse_adapter.config import ConfigReader, field_error, is_number

ROPE_TYPES = ("default", "linear", "dynamic", "llama3")
# Keys a rope dict may hold (as the C++ families accept them; upstream ignores unknown keys
# with a warning, which the adapter refuses instead).
_KNOWN_ROPE_KEYS = ("rope_type", "type", "rope_theta", "factor", "low_freq_factor",
                    "high_freq_factor", "original_max_position_embeddings",
                    "partial_rotary_factor")


@dataclass(frozen=True)
class RopeArgs:
    rope_type: str = "default"
    rope_theta: Any = 10000.0              # as stored in config.json (int or float)
    factor: Any = None                     # linear, dynamic, llama3
    low_freq_factor: Any = None            # llama3
    high_freq_factor: Any = None           # llama3
    original_max_position_embeddings: Any = None  # llama3
    partial_rotary_factor: Any = 1.0       # upstream ignores it for "default"
    source: str = "default"                # the config field the dict came from


def parse_rope(reader: ConfigReader, default_theta: float = 10000.0) -> RopeArgs:
    """RoPE settings from rope_parameters (transformers 5) or rope_scaling (older configs), with
    rope_theta / partial_rotary_factor from the top level where the dict lacks them, as
    RotaryEmbeddingConfigMixin.convert_rope_params_to_dict / standardize_rope_params do.
    Raises ValueError naming the field."""
    params = reader.raw("rope_parameters")
    scaling = reader.raw("rope_scaling")
    if params and scaling and params != scaling:
        raise ValueError(f"config fields 'rope_parameters' = {params} and 'rope_scaling' = "
                         f"{scaling} disagree; transformers 5 reads only one of them")
    # Upstream: rope_parameters = rope_scaling or rope_parameters or {}.
    if scaling:
        d, prefix = scaling, "rope_scaling"
    elif params:
        d, prefix = params, "rope_parameters"
    else:
        d, prefix = {}, "rope_parameters"
    if not isinstance(d, dict):
        raise field_error(prefix, d, "expected an object")
    for key in d:
        if key not in _KNOWN_ROPE_KEYS:
            raise field_error(f"{prefix}.{key}", d[key], "unsupported RoPE key (known: "
                              + ", ".join(_KNOWN_ROPE_KEYS) + ")")

    top_theta = reader.number("rope_theta", None)
    top_prf = reader.number("partial_rotary_factor", None)

    rope_type = d.get("rope_type", d.get("type", "default"))
    type_field = f"{prefix}.rope_type" if "rope_type" in d or "type" not in d else f"{prefix}.type"
    if rope_type not in ROPE_TYPES:
        raise field_error(type_field, rope_type, "unsupported RoPE type (implemented: "
                          + ", ".join(f'"{t}"' for t in ROPE_TYPES) + ")")

    theta = d.get("rope_theta", top_theta if top_theta is not None else default_theta)
    if not is_number(theta) or not theta > 0:
        raise field_error(f"{prefix}.rope_theta" if "rope_theta" in d else "rope_theta", theta,
                          "must be a positive number")
    prf = d.get("partial_rotary_factor", top_prf if top_prf is not None else 1.0)
    if not is_number(prf) or not 0 < prf <= 1:
        raise field_error(f"{prefix}.partial_rotary_factor" if "partial_rotary_factor" in d
                          else "partial_rotary_factor", prf, "must be in (0, 1]")
    if rope_type != "default" and prf != 1:
        # Upstream builds cos/sin of int(head_dim * prf) dims and multiplies them with the full
        # head: it cannot run such a config.
        raise field_error(f"{prefix}.partial_rotary_factor" if "partial_rotary_factor" in d
                          else "partial_rotary_factor", prf,
                          f"partial rotary embeddings are not supported with rope_type "
                          f"\"{rope_type}\" (upstream llama rotates the whole head)")

    def need(key: str) -> Any:
        v = d.get(key)
        if v is None:
            raise ValueError(f"config field '{prefix}.{key}' is required for rope_type "
                             f"\"{rope_type}\" but missing")
        if not is_number(v):
            raise field_error(f"{prefix}.{key}", v, "expected a finite number")
        return v

    factor = low = high = omp = None
    if rope_type != "default":
        factor = need("factor")
        if not factor >= 1:
            raise field_error(f"{prefix}.factor", factor, "must be >= 1")
    if rope_type == "llama3":
        low, high = need("low_freq_factor"), need("high_freq_factor")
        if not high > low:
            raise field_error(f"{prefix}.high_freq_factor", high, "must exceed low_freq_factor")
        # standardize_rope_params: a top-level original_max_position_embeddings wins, else the
        # dict's, else max_position_embeddings.
        top_omp = reader.int("original_max_position_embeddings", None)
        omp = top_omp if top_omp is not None else d.get("original_max_position_embeddings")
        if omp is None:
            omp = reader.int("max_position_embeddings", None)
        if isinstance(omp, bool) or not isinstance(omp, int) or omp <= 0:
            raise field_error(f"{prefix}.original_max_position_embeddings", omp,
                              "must be a positive integer for rope_type \"llama3\"")
    elif reader.present("original_max_position_embeddings"):
        reader.ignore("original_max_position_embeddings",
                      f"read by upstream only for rope types llama3, yarn and longrope; this "
                      f"config's rope_type is \"{rope_type}\"")
    return RopeArgs(rope_type=rope_type, rope_theta=theta, factor=factor, low_freq_factor=low,
                    high_freq_factor=high, original_max_position_embeddings=omp,
                    partial_rotary_factor=prf, source=prefix)


# -- inv_freq, upstream's expressions -----------------------------------------------------------

def _default_inv_freq(base, dim: int) -> torch.Tensor:
    # compute_default_rope_parameters (dim = head_dim: partial_rotary_factor is not read)
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))


def _linear_inv_freq(base, dim: int, factor) -> torch.Tensor:
    # _compute_linear_scaling_rope_parameters
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=None, dtype=torch.float) / dim))
    inv_freq /= factor
    return inv_freq


def _dynamic_inv_freq(base, dim: int, factor, max_position_embeddings: int, seq_len=None,
                      device=None) -> torch.Tensor:
    # _compute_dynamic_ntk_parameters
    if seq_len is None:
        seq_len = max_position_embeddings
    elif isinstance(seq_len, torch.Tensor):
        seq_len = torch.maximum(
            seq_len,
            torch.tensor(max_position_embeddings, dtype=seq_len.dtype, device=seq_len.device),
        )
    else:
        seq_len = max(seq_len, max_position_embeddings)
    base = base * ((factor * seq_len / max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2))
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim))
    return inv_freq


def _llama3_inv_freq(base, dim: int, factor, low_freq_factor, high_freq_factor,
                     old_context_len) -> torch.Tensor:
    # _compute_llama3_parameters
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=None, dtype=torch.float) / dim))
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    inv_freq_llama = torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)
    return inv_freq_llama


def init_inv_freq(rope: RopeArgs, head_dim: int, max_position_embeddings: int
                  ) -> tuple[torch.Tensor, float]:
    """(inv_freq fp32 [rotary_dim / 2] on the CPU, attention_scaling) as upstream's
    *RotaryEmbedding.__init__ computes them."""
    with torch.device("cpu"):
        if rope.rope_type == "default":
            return _default_inv_freq(rope.rope_theta, head_dim), 1.0
        dim = int(head_dim * rope.partial_rotary_factor)
        if rope.rope_type == "linear":
            return _linear_inv_freq(rope.rope_theta, dim, rope.factor), 1.0
        if rope.rope_type == "dynamic":
            return _dynamic_inv_freq(rope.rope_theta, dim, rope.factor, max_position_embeddings), 1.0
        if rope.rope_type == "llama3":
            return _llama3_inv_freq(rope.rope_theta, dim, rope.factor, rope.low_freq_factor,
                                    rope.high_freq_factor,
                                    rope.original_max_position_embeddings), 1.0
    raise ValueError(f"unsupported rope_type {rope.rope_type!r}")


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotates half the hidden dims of the input."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim: int = 1):
    """q, k [B, H, T, D]; cos, sin [B, T, D]."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


class RotaryEmbedding:
    """cos/sin tables for given positions. A plain object, not an nn.Module: inv_freq is not a
    buffer, so ``model.to(torch.bfloat16)`` cannot round it (upstream keeps it fp32 too)."""

    def __init__(self, rope: RopeArgs, head_dim: int, max_position_embeddings: int):
        self.rope = rope
        self.head_dim = head_dim
        self.max_position_embeddings = max_position_embeddings
        self.inv_freq, self.attention_scaling = init_inv_freq(rope, head_dim,
                                                              max_position_embeddings)
        self._on_device: dict[torch.device, torch.Tensor] = {}

    def _inv_freq_for(self, positions: torch.Tensor) -> tuple[torch.Tensor, float]:
        device = positions.device
        if self.rope.rope_type == "dynamic":
            # dynamic_rope_update: seq_len = max(position_ids) + 1 (a 0-d tensor)
            seq_len = torch.max(positions) + 1
            if seq_len > self.max_position_embeddings:
                dim = int(self.head_dim * self.rope.partial_rotary_factor)
                inv = _dynamic_inv_freq(self.rope.rope_theta, dim, self.rope.factor,
                                        self.max_position_embeddings, seq_len=seq_len,
                                        device=device)
                return inv, 1.0
        inv = self._on_device.get(device)
        if inv is None:
            inv = self._on_device[device] = self.inv_freq.to(device)
        return inv, self.attention_scaling

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] (int64) -> cos, sin [B, T, rotary_dim] in dtype."""
        inv_freq, attention_scaling = self._inv_freq_for(positions)
        freqs = positions[..., None].float() * inv_freq.to(device=positions.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * attention_scaling
        sin = emb.sin() * attention_scaling
        return cos.to(dtype=dtype), sin.to(dtype=dtype)
