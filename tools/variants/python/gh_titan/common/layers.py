"""The decoder both gh_titan families share, written as torchtitan writes its Llama 3 / Qwen3
blocks (torchtitan/models/common: GQAttention, FeedForward, Decoder), under its names:

  tok_embeddings.weight
  layers.N.attention_norm.weight
  layers.N.attention.{wq,wk,wv,wo}.weight      (wq / wk rows in interleaved-pair order)
  layers.N.attention.{q,k}_norm.weight         (Qwen3; interleaved-pair order too)
  layers.N.ffn_norm.weight
  layers.N.feed_forward.{w1,w2,w3}.weight      (gate, down, up)
  norm.weight
  output.weight                                (tied: the embedding Parameter itself)

Forward is torchtitan's, ``forward(tokens [B, T], attention_masks=None, positions=None)`` ->
logits [B, T, vocab] in the parameters' dtype: one scaled_dot_product_attention call per layer
with ``is_causal`` (torchtitan's sdpa path). Gatehouse's packed rows reach it through the
torchtitan shim (gatehouse_adapter.frameworks.torchtitan), one sequence per call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gh_titan.common.args import TitanArgs
from gh_titan.common.rope import FreqsCis, apply_rotary_emb


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1(x)) * w3(x))."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Attention(nn.Module):
    """Grouped-query attention: projections, optional per-head q/k RMSNorm, complex RoPE, SDPA.

    Head counts come from the projections' output sizes (views use -1 heads)."""

    def __init__(self, args: TitanArgs):
        super().__init__()
        self.head_dim = args.head_dim
        self.enable_gqa = args.n_heads != args.n_kv_heads
        self.scaling = args.head_dim ** -0.5
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        if args.qk_norm:
            self.q_norm = nn.RMSNorm(args.head_dim, eps=args.norm_eps)
            self.k_norm = nn.RMSNorm(args.head_dim, eps=args.norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        if self.q_norm is not None:
            xq = self.q_norm(xq)
            xk = self.k_norm(xk)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        # [B, T, N, H] -> [B, N, T, H] for the kernel and back.
        out = F.scaled_dot_product_attention(
            xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2),
            attn_mask=mask, is_causal=mask is None, scale=self.scaling,
            enable_gqa=self.enable_gqa)
        out = out.transpose(1, 2).contiguous().view(bs, seqlen, -1)
        return self.wo(out)


class TransformerBlock(nn.Module):
    def __init__(self, args: TitanArgs):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, args.hidden_dim)
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Decoder(nn.Module):
    """torchtitan's ``forward(tokens [B, T], attention_masks=None, positions [B, T] | None)`` ->
    logits [B, T, vocab_size] in the parameters' dtype: causal attention over each row (the
    sdpa path; torchtitan's flex / varlen document masks are not ported), positions 0..T-1
    when not given."""

    def __init__(self, model_args: TitanArgs):
        super().__init__()
        self.model_args = model_args
        self.tok_embeddings = nn.Embedding(model_args.vocab_size, model_args.dim,
                                           padding_idx=model_args.pad_token_id)
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(model_args) for i in range(model_args.n_layers)})
        self.norm = nn.RMSNorm(model_args.dim, eps=model_args.norm_eps)
        self.output = nn.Linear(model_args.dim, model_args.vocab_size, bias=False)
        self.freqs_cis = FreqsCis(model_args.rope, model_args.head_dim, model_args.max_seq_len)
        if model_args.enable_weight_tying:
            self.output.weight = self.tok_embeddings.weight

    @torch.no_grad()
    def init_weights(self, buffer_device: torch.device | None = None) -> None:
        """Fresh weights (torchtitan's init; a loaded checkpoint overwrites them). The RoPE
        table is a plain object computed on the CPU and moved per device on first use, so
        buffer_device needs nothing here."""
        nn.init.normal_(self.tok_embeddings.weight)
        for module in self.modules():
            if isinstance(module, nn.Linear) and module is not self.output:
                nn.init.trunc_normal_(module.weight, mean=0.0, std=0.02)
            elif isinstance(module, nn.RMSNorm):
                module.reset_parameters()
        if self.output.weight is not self.tok_embeddings.weight:
            std = self.model_args.dim ** -0.5
            nn.init.trunc_normal_(self.output.weight, std=std, a=-3 * std, b=3 * std)

    def forward(self, tokens: torch.Tensor, attention_masks=None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        if attention_masks is not None:
            raise NotImplementedError("flex / varlen attention masks are not ported: this "
                                      "model attends causally over each row (sdpa)")
        if positions is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        h = self.tok_embeddings(tokens)
        freqs_cis = self.freqs_cis(positions)
        for layer in self.layers.values():
            h = layer(h, freqs_cis, None)
        return self.output(self.norm(h))
