"""Qwen3-MoE as transformers' Qwen3MoeForCausalLM computes it (eager attention, the default
"grouped_mm" experts implementation), in Archon's layout.

Parameter names (torchtitan / Archon):
  tok_embeddings.weight                       model.embed_tokens.weight
  layers.N.attention_norm.weight              model.layers.N.input_layernorm.weight
  layers.N.attention.w{q,k,v,o}.{weight,bias} model.layers.N.self_attn.{q,k,v,o}_proj.*
  layers.N.attention.{q,k}_norm.weight        model.layers.N.self_attn.{q,k}_norm.weight
  layers.N.ffn_norm.weight                    model.layers.N.post_attention_layernorm.weight
  dense layers:
  layers.N.feed_forward.w1/w3/w2.weight       model.layers.N.mlp.gate/up/down_proj.weight
  sparse layers:
  layers.N.moe.router.gate.weight             model.layers.N.mlp.gate.weight
  layers.N.moe.experts.w13 [E, 2I, dim]       model.layers.N.mlp.experts.E.{gate,up}_proj.weight
  layers.N.moe.experts.w2  [E, dim, I]        model.layers.N.mlp.experts.E.down_proj.weight
  norm.weight                                 model.norm.weight
  output.weight                               lm_head.weight (tied: the embedding itself)
"""

from __future__ import annotations

import torch
from torch import nn

from gh_archon.common.kv_cache import KVCache
from gh_archon.common.layers import (Attention, FeedForward, RMSNorm, rope_tables,
                                     segments_from_cu_seqlens)
from gh_archon.qwen3_moe.model.args import Qwen3MoeModelArgs
from gh_archon.qwen3_moe.model.moe import MoE
from gh_archon.qwen3_moe.model.rope import RotaryEmbedding


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: Qwen3MoeModelArgs, dtype: torch.dtype | None = None):
        super().__init__()
        self.layer_id = layer_id
        self.attention = Attention(args.dim, args.n_heads, args.n_kv_heads, args.head_dim,
                                   bias=args.attention_bias, qk_norm=True, norm_eps=args.norm_eps,
                                   sliding_window=args.sliding_window, dtype=dtype)
        self.moe_enabled = args.moe_layers[layer_id]
        if self.moe_enabled:
            self.moe = MoE(args.dim, args.moe_inter_dim, args.num_experts, args.top_k,
                           args.norm_topk_prob, args.hidden_act, dtype=dtype)
            self.feed_forward = None
        else:
            # Qwen3MoeMLP: no biases
            self.moe = None
            self.feed_forward = FeedForward(args.dim, args.hidden_dim, bias=False,
                                            act=args.hidden_act, dtype=dtype)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps, dtype=dtype)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps, dtype=dtype)

    def forward(self, x, cos, sin, segments):
        x = x + self.attention(self.attention_norm(x), cos, sin, segments)
        if self.moe_enabled:
            x = x + self.moe(self.ffn_norm(x))
        else:
            x = x + self.feed_forward(self.ffn_norm(x))
        return x

    def forward_cached(self, x, cos, sin, cache: KVCache):
        """forward for new positions after the cached ones (gh_archon.common.kv_cache)."""
        x = x + self.attention.forward_cached(self.attention_norm(x), cos, sin, cache,
                                              self.layer_id)
        if self.moe_enabled:
            x = x + self.moe(self.ffn_norm(x))
        else:
            x = x + self.feed_forward(self.ffn_norm(x))
        return x


class Qwen3MoeModel(nn.Module):
    """forward(tokens [B, T], positions [B, T], cu_seqlens [S + 1] | None, max_seqlen) ->
    logits [B, T, vocab_size] in the parameters' dtype (contract v1, gatehouse_adapter)."""

    def __init__(self, args: Qwen3MoeModelArgs, dtype: torch.dtype | None = None):
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


def build_model(args: Qwen3MoeModelArgs, dtype: torch.dtype, device) -> Qwen3MoeModel:
    """Parameters in dtype on device, uninitialised (the worker assigns the checkpoint's)."""
    with torch.device("meta"):
        model = Qwen3MoeModel(args, dtype=dtype)
    model = model.to_empty(device=device)
    model.tie_weights()
    for layer in model.layers.values():
        if layer.moe is not None:  # to_empty left the routing counts uninitialised
            layer.moe.tokens_per_expert.zero_()
            layer.moe.router_near_ties.zero_()
    return model.eval()
