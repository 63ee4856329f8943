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

The RoPE settings are read from transformers' config object, which standardises config.json's
rope_parameters / rope_scaling / rope_theta into ``rope_parameters``. Other RoPE types (linear,
dynamic, yarn, longrope, ...) and partial rotary factors are refused by the families' Fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from gatehouse_adapter.config import field_error, is_number

ROPE_TYPES = ("default", "llama3")


@dataclass(frozen=True)
class RopeArgs:
    rope_type: str = "default"
    theta: float = 10000.0
    factor: float | None = None                       # llama3
    low_freq_factor: float | None = None              # llama3
    high_freq_factor: float | None = None             # llama3
    original_max_position_embeddings: int | None = None  # llama3


def rope_args_from_hf(hf_config: Any) -> RopeArgs:
    """RopeArgs from transformers' standardised ``rope_parameters`` (the port's Fields already
    refused other rope types and keys in config.json); ValueError naming the field for a value
    the frequencies cannot be computed from."""
    d = dict(getattr(hf_config, "rope_parameters", None) or {})
    rope_type = d.get("rope_type", d.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise field_error("rope_parameters.rope_type", rope_type,
                          "RoPE type not implemented by this adapter (implemented: "
                          + ", ".join(f'"{t}"' for t in ROPE_TYPES) + ")")
    theta = d.get("rope_theta", getattr(hf_config, "rope_theta", None))
    if not is_number(theta) or not theta > 0:
        raise field_error("rope_parameters.rope_theta", theta, "must be a positive number")
    if rope_type == "default":
        return RopeArgs(theta=float(theta))

    def need(key: str) -> Any:
        v = d.get(key)
        if not is_number(v):
            raise field_error(f"rope_parameters.{key}", v,
                              f"a finite number is required for rope_type \"{rope_type}\"")
        return v

    factor, low, high = need("factor"), need("low_freq_factor"), need("high_freq_factor")
    if not factor >= 1:
        raise field_error("rope_parameters.factor", factor, "must be >= 1")
    if not high > low:
        raise field_error("rope_parameters.high_freq_factor", high,
                          "must exceed low_freq_factor")
    omp = getattr(hf_config, "original_max_position_embeddings", None)
    if omp is None:
        omp = d.get("original_max_position_embeddings")
    if omp is None:
        omp = getattr(hf_config, "max_position_embeddings", None)
    if isinstance(omp, bool) or not isinstance(omp, int) or omp <= 0:
        raise field_error("original_max_position_embeddings", omp,
                          "must be a positive integer for rope_type \"llama3\"")
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
