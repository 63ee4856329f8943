"""Llama as transformers' LlamaForCausalLM computes it (eager attention), in Archon's layout.

Parameter names (torchtitan / Archon):
  tok_embeddings.weight                      model.embed_tokens.weight
  layers.N.attention_norm.weight             model.layers.N.input_layernorm.weight
  layers.N.attention.w{q,k,v,o}.{weight,bias} model.layers.N.self_attn.{q,k,v,o}_proj.*
  layers.N.ffn_norm.weight                   model.layers.N.post_attention_layernorm.weight
  layers.N.feed_forward.w1/w3/w2.{weight,bias} model.layers.N.mlp.gate/up/down_proj.*
  norm.weight                                model.norm.weight
  output.weight                              lm_head.weight (tied: the embedding itself)
"""

from __future__ import annotations

import torch
from torch import nn

from gh_archon.common.kv_cache import KVCache
from gh_archon.common.layers import (Attention, FeedForward, RMSNorm, rope_tables,
                                     segments_from_cu_seqlens)
from gh_archon.llama.model.args import LlamaModelArgs
from gh_archon.llama.model.rope import RotaryEmbedding


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: LlamaModelArgs, dtype: torch.dtype | None = None):
        super().__init__()
        self.layer_id = layer_id
        self.attention = Attention(args.dim, args.n_heads, args.n_kv_heads, args.head_dim,
                                   bias=args.attention_bias, qk_norm=False, norm_eps=args.norm_eps,
                                   sliding_window=None, dtype=dtype)
        self.feed_forward = FeedForward(args.dim, args.hidden_dim, bias=args.mlp_bias,
                                        act=args.hidden_act, dtype=dtype)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps, dtype=dtype)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps, dtype=dtype)

    def forward(self, x, cos, sin, segments):
        x = x + self.attention(self.attention_norm(x), cos, sin, segments)
        x = x + self.feed_forward(self.ffn_norm(x))
        return x

    def forward_cached(self, x, cos, sin, cache: KVCache):
        """forward for new positions after the cached ones (gh_archon.common.kv_cache)."""
        x = x + self.attention.forward_cached(self.attention_norm(x), cos, sin, cache,
                                              self.layer_id)
        x = x + self.feed_forward(self.ffn_norm(x))
        return x


class LlamaModel(nn.Module):
    """forward(tokens [B, T], positions [B, T], cu_seqlens [S + 1] | None, max_seqlen) ->
    logits [B, T, vocab_size] in the parameters' dtype (contract v1, gatehouse_adapter)."""

    def __init__(self, args: LlamaModelArgs, dtype: torch.dtype | None = None):
        super().__init__()
        self.model_args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim,
                                           padding_idx=args.pad_token_id, dtype=dtype)
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(i, args, dtype) for i in range(args.n_layers)})
        self.norm = RMSNorm(args.dim, args.norm_eps, dtype=dtype)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False, dtype=dtype)
        self.rope = RotaryEmbedding(args.rope, args.head_dim, args.max_seq_len)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Tied: output.weight is the embedding Parameter (named_parameters yields it once)."""
        if self.model_args.tie_word_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor,
                cu_seqlens: torch.Tensor | None = None,
                max_seqlen: int | None = None) -> torch.Tensor:
        segments = segments_from_cu_seqlens(tokens, positions, cu_seqlens)
        h = self.tok_embeddings(tokens)
        cos, sin = rope_tables(self.rope, positions, segments, h.dtype)
        for layer in self.layers.values():
            h = layer(h, cos, sin, segments)
        h = self.norm(h)
        return self.output(h)

    def forward_cached(self, tokens: torch.Tensor, positions: torch.Tensor,
                       cache: KVCache) -> torch.Tensor:
        """The decode path (ModelSpec.decode_forward): tokens, positions [B, T] int64, the
        positions absolute and following the ``cache.length`` cached ones -> logits [B, T,
        vocab_size]; every layer's new keys and values are written to ``cache`` (the caller
        advances its length). A prefill is this over the prompt on an empty cache."""
        h = self.tok_embeddings(tokens)
        cos, sin = self.rope(positions, h.dtype)
        for layer in self.layers.values():
            h = layer.forward_cached(h, cos, sin, cache)
        h = self.norm(h)
        return self.output(h)


def build_model(args: LlamaModelArgs, dtype: torch.dtype, device) -> LlamaModel:
    """Parameters in dtype on device, uninitialised (the worker assigns the checkpoint's):
    built on the meta device, then materialised, so no time goes into random init."""
    with torch.device("meta"):
        model = LlamaModel(args, dtype=dtype)
    model = model.to_empty(device=device)
    model.tie_weights()
    return model.eval()
