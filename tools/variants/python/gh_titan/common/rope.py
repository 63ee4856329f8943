"""Rotary position embeddings as torchtitan computes them (ComplexRoPE): one complex number per
(re, im) pair of adjacent head dimensions, rotated by a precomputed complex table.

Frequencies (fp32, on the CPU):
  default  1 / theta^(2i/d), i < d/2
  llama3   Llama 3.1's smooth scaling around original_max_position_embeddings: wavelengths
           longer than omp / low_freq_factor divided by `factor`, shorter than
           omp / high_freq_factor kept, the band between interpolated
freqs_cis[p, i] = polar(1, p * freq_i) (complex64), built for positions [0, end).

Applying: x [..., d] -> x.float() viewed as [..., d/2] complex (re = dim 2i, im = dim 2i+1),
times freqs_cis, back to real, flattened, cast to x's dtype. The checkpoint holds q/k rows in
transformers' rotate-half layout (pair i = dims i and i + d/2), so the state-dict adapter
permutes them into interleaved pairs (gh_titan.common.state_dict).

The RoPE settings are parsed from config.json as transformers 5 standardises them
(rope_parameters, or rope_scaling in older configs, with rope_theta / partial_rotary_factor /
original_max_position_embeddings from the top level where the dict lacks them). Other RoPE
types (linear, dynamic, yarn, longrope, ...) and partial rotary factors are refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from gh_titan.common.config import ConfigReader, field_error, is_number

ROPE_TYPES = ("default", "llama3")
_KNOWN_KEYS = ("rope_type", "type", "rope_theta", "factor", "low_freq_factor",
               "high_freq_factor", "original_max_position_embeddings", "partial_rotary_factor")


@dataclass(frozen=True)
class RopeArgs:
    rope_type: str = "default"
    theta: float = 10000.0
    factor: float | None = None                       # llama3
    low_freq_factor: float | None = None              # llama3
    high_freq_factor: float | None = None             # llama3
    original_max_position_embeddings: int | None = None  # llama3


def parse_rope(reader: ConfigReader, default_theta: float) -> RopeArgs:
    """RopeArgs from the config; ValueError naming the field for anything not implemented."""
    params = reader.raw("rope_parameters")
    scaling = reader.raw("rope_scaling")
    if params and scaling and params != scaling:
        raise ValueError(f"config fields 'rope_parameters' = {params} and 'rope_scaling' = "
                         f"{scaling} disagree; transformers 5 reads only one of them")
    if scaling:
        d, prefix = scaling, "rope_scaling"
    elif params:
        d, prefix = params, "rope_parameters"
    else:
        d, prefix = {}, "rope_parameters"
    if not isinstance(d, dict):
        raise field_error(prefix, d, "expected an object")
    for key in d:
        if key not in _KNOWN_KEYS:
            raise field_error(f"{prefix}.{key}", d[key], "unsupported RoPE key")

    rope_type = d.get("rope_type", d.get("type", "default"))
    type_field = f"{prefix}.rope_type" if "rope_type" in d or "type" not in d else f"{prefix}.type"
    if rope_type not in ROPE_TYPES:
        raise field_error(type_field, rope_type, "RoPE type not implemented by this adapter "
                          "(implemented: " + ", ".join(f'"{t}"' for t in ROPE_TYPES) + ")")

    top_theta = reader.number("rope_theta", None)
    if "rope_theta" in d:
        theta, theta_field = d["rope_theta"], f"{prefix}.rope_theta"
    else:
        theta = top_theta if top_theta is not None else default_theta
        theta_field = "rope_theta"
    if not is_number(theta) or not theta > 0:
        raise field_error(theta_field, theta, "must be a positive number")

    top_prf = reader.number("partial_rotary_factor", None)
    prf_field = f"{prefix}.partial_rotary_factor" if "partial_rotary_factor" in d \
        else "partial_rotary_factor"
    prf = d.get("partial_rotary_factor", top_prf if top_prf is not None else 1.0)
    if not is_number(prf) or prf != 1:
        raise field_error(prf_field, prf, "partial rotary embeddings are not implemented by "
                          "this adapter (it rotates the whole head)")

    def need(key: str) -> Any:
        v = d.get(key)
        if v is None:
            raise ValueError(f"config field '{prefix}.{key}' is required for rope_type "
                             f"\"{rope_type}\" but missing")
        if not is_number(v):
            raise field_error(f"{prefix}.{key}", v, "expected a finite number")
        return v

    if rope_type == "default":
        for key in ("factor", "low_freq_factor", "high_freq_factor"):
            if d.get(key) is not None:
                raise field_error(f"{prefix}.{key}", d[key],
                                  "given with rope_type \"default\", which does not read it")
        if reader.present("original_max_position_embeddings"):
            reader.ignore("original_max_position_embeddings",
                          "read by upstream only for rope types llama3, yarn and longrope; "
                          "this config's rope_type is \"default\"")
        return RopeArgs(theta=float(theta))

    factor = need("factor")
    if not factor >= 1:
        raise field_error(f"{prefix}.factor", factor, "must be >= 1")
    low, high = need("low_freq_factor"), need("high_freq_factor")
    if not high > low:
        raise field_error(f"{prefix}.high_freq_factor", high, "must exceed low_freq_factor")
    top_omp = reader.int("original_max_position_embeddings", None)
    omp = top_omp if top_omp is not None else d.get("original_max_position_embeddings")
    omp_field = "original_max_position_embeddings" if top_omp is not None \
        else f"{prefix}.original_max_position_embeddings"
    if omp is None:
        omp, omp_field = reader.int("max_position_embeddings", None), "max_position_embeddings"
    if isinstance(omp, bool) or not isinstance(omp, int) or omp <= 0:
        raise field_error(omp_field, omp, "must be a positive integer for rope_type \"llama3\"")
    return RopeArgs(rope_type="llama3", theta=float(theta), factor=factor,
                    low_freq_factor=low, high_freq_factor=high,
                    original_max_position_embeddings=omp)


def rope_frequencies(rope: RopeArgs, dim: int) -> torch.Tensor:
    """fp32 [dim / 2] rotation frequencies (torchtitan's, llama scaling included)."""
    with torch.device("cpu"):
        freqs = 1.0 / (rope.theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
        if rope.rope_type == "default":
            return freqs
        factor, low, high = rope.factor, rope.low_freq_factor, rope.high_freq_factor
        omp = rope.original_max_position_embeddings
        wavelen = 2 * math.pi / freqs
        high_freq_wavelen = omp / high
        low_freq_wavelen = omp / low
        freqs = torch.where(wavelen > low_freq_wavelen, freqs / factor, freqs)
        smooth = (omp / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * freqs / factor + smooth * freqs
        medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(medium, smoothed, freqs)


def precompute_freqs_cis(rope: RopeArgs, dim: int, end: int) -> torch.Tensor:
    """complex64 [end, dim / 2]: polar(1, position x frequency)."""
    freqs = rope_frequencies(rope, dim)
    t = torch.arange(end, device=freqs.device)
    angles = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(angles), angles)


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """xq [B, T, H, D], xk [B, T, H_kv, D] with interleaved pairs; freqs_cis complex64
    [B, T, 1, D / 2]. Returns both rotated, in their own dtypes."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class FreqsCis:
    """The complex table, gathered per token position. A plain object rather than a buffer:
    ``model.to(dtype)`` must not touch a complex table, and a model built on the meta device
    must not lose it. Grown (recomputed over a longer range, the same values for the positions
    it had) when a position reaches past it."""

    def __init__(self, rope: RopeArgs, head_dim: int, max_seq_len: int):
        self.rope = rope
        self.head_dim = head_dim
        self.table = precompute_freqs_cis(rope, head_dim, max_seq_len)
        self._on_device: dict[torch.device, torch.Tensor] = {}

    def __call__(self, positions: torch.Tensor) -> torch.Tensor:
        """positions [B, T] (int) -> complex64 [B, T, 1, head_dim / 2] on positions' device."""
        if positions.numel():
            top = int(positions.max())
            if int(positions.min()) < 0:
                raise ValueError("positions must be non-negative")
            if top >= self.table.shape[0]:
                end = 1 << top.bit_length()
                self.table = precompute_freqs_cis(self.rope, self.head_dim, end)
                self._on_device.clear()
        table = self._on_device.get(positions.device)
        if table is None:
            table = self._on_device[positions.device] = self.table.to(positions.device)
        return table[positions].unsqueeze(2)
