"""The adapters' own KV cache: the optional decode part of the Gatehouse contract
(``ModelSpec.init_cache`` / ``ModelSpec.decode_forward``, python/gatehouse_adapter), shared by
the llama and qwen3_moe decoders.

A prefill is ``decode_forward`` over the whole prompt on an empty cache; a step is
``decode_forward`` over one token. Each layer's keys are cached *after* RoPE, at their absolute
position, so a step computes only its own token's projections and attends over the cached
ones: keys rotated once, at the position they were computed for (as upstream's DynamicCache).

Sliding window: a layer with a window attends, for each query, to the last ``sliding_window``
positions only, itself included (transformers' ``sliding_window``). The cache keeps every
position, and a cached forward reads only the keys some new query can see, ``[start -
(window - 1), end)``: for a step that is the window's keys exactly, the keys upstream's
``DynamicSlidingWindowLayer`` holds, with the same shapes (its cat-grown tensors).
"""

from __future__ import annotations

import torch
from torch import nn


class KVCache:
    """Preallocated keys and values of every layer: ``keys[i]`` and ``values[i]`` are
    ``[B, n_kv_heads, max_len, head_dim]`` in the model's dtype on its device. ``length``
    positions are filled (absolute positions ``[0, length)``). Not thread-safe."""

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.max_len = max_len
        self.length = 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, sliding_window: int | None
               ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Writes the new positions' keys and values (k, v ``[B, n_kv_heads, T, head_dim]``,
        RoPE applied) at ``[length, length + T)`` of ``layer`` and returns ``(keys, values,
        first)``: the keys and values some new query may attend to, positions ``[first,
        length + T)``, as contiguous tensors. Raises ValueError on overflow."""
        start, t = self.length, k.shape[-2]
        end = start + t
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: {start} cached + {t} new > max_len {self.max_len}")
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        first = max(0, start - (sliding_window - 1)) if sliding_window else 0
        return (self.keys[layer][:, :, first:end].contiguous(),
                self.values[layer][:, :, first:end].contiguous(), first)


_MASKS: dict[tuple, torch.Tensor] = {}


def cached_mask(start: int, length: int, first: int, sliding_window: int | None,
                dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[T, end - first] additive mask for queries at positions ``[start, start + T)`` over keys
    at ``[first, end)``, ``end = start + T``: 0 where key kv may be seen by query q (kv <= q,
    and kv > q - sliding_window with a window), dtype's min elsewhere (transformers' eager
    mask). On an empty cache it is the training forward's causal mask."""
    key = (start, length, first, sliding_window, dtype, device)
    mask = _MASKS.get(key)
    if mask is None:
        q = torch.arange(start, start + length, device=device)[:, None]
        kv = torch.arange(first, start + length, device=device)[None, :]
        allowed = kv <= q
        if sliding_window is not None:
            allowed = allowed & (kv > q - sliding_window)
        mask = torch.where(allowed, torch.tensor(0.0, dtype=dtype, device=device),
                           torch.finfo(dtype).min)
        if len(_MASKS) > 256:
            _MASKS.clear()
        _MASKS[key] = mask
    return mask


def init_cache(model: nn.Module, batch: int, max_len: int, dtype: torch.dtype,
               device: torch.device) -> KVCache:
    """ModelSpec.init_cache: an empty cache for ``batch`` rows of up to ``max_len`` positions
    of a decoder of this package (its ``model_args``: n_layers, n_kv_heads, head_dim)."""
    args = model.model_args
    return KVCache(args.n_layers, batch, args.n_kv_heads, max_len, args.head_dim, dtype, device)


def decode_forward(model: nn.Module, tokens: torch.Tensor, positions: torch.Tensor,
                   cache: KVCache) -> torch.Tensor:
    """ModelSpec.decode_forward: tokens, positions ``[B, T]`` int64 (absolute positions
    ``[cache.length, cache.length + T)``) -> logits ``[B, T, vocab_size]`` in the model's
    dtype; appends the T positions' keys and values to ``cache``."""
    logits = model.forward_cached(tokens, positions, cache)
    # Filled through the last position written.
    cache.length = int(positions[0, -1]) + 1
    return logits
