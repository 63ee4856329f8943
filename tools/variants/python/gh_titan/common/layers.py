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

Forward (contract v1, gatehouse_adapter): tokens [B, T], positions [B, T], cu_seqlens, max_seqlen
-> logits [B, T, vocab] in the parameters' dtype. Attention is one
scaled_dot_product_attention call per layer: ``is_causal`` for plain rows, a block-diagonal
causal boolean mask when cu_seqlens packs several sequences into the row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gh_titan.common.rope import FreqsCis, RopeArgs, apply_rotary_emb


@dataclass
class TitanArgs:
    """The sizes and switches the decoder is built from (parsed by each family's args.py)."""
    model_type: str
    vocab_size: int
    dim: int                      # hidden_size
    n_layers: int                 # num_hidden_layers
    n_heads: int                  # num_attention_heads
    n_kv_heads: int               # num_key_value_heads
    head_dim: int
    hidden_dim: int               # intermediate_size
    norm_eps: float               # rms_norm_eps
    max_seq_len: int              # max_position_embeddings (the freqs_cis table's length)
    rope: RopeArgs
    tie_word_embeddings: bool = False
    pad_token_id: int | None = None   # nn.Embedding padding_idx, as upstream's embedding
    qk_norm: bool = False             # Qwen3: RMSNorm per head on q and k before RoPE


def gate_facts(args: TitanArgs) -> dict:
    return {"vocab_size": args.vocab_size, "num_hidden_layers": args.n_layers,
            "num_key_value_heads": args.n_kv_heads, "head_dim": args.head_dim,
            "max_position_embeddings": args.max_seq_len,
            "tie_word_embeddings": args.tie_word_embeddings, "min_sliding_window": 0}


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1(x)) * w3(x))."""

    def __init__(self, dim: int, hidden_dim: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False, dtype=dtype)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False, dtype=dtype)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Attention(nn.Module):
    """Grouped-query attention: projections, optional per-head q/k RMSNorm, complex RoPE, SDPA.

    Head counts come from the projections' output sizes (views use -1 heads)."""

    def __init__(self, args: TitanArgs, dtype: torch.dtype | None = None):
        super().__init__()
        self.head_dim = args.head_dim
        self.enable_gqa = args.n_heads != args.n_kv_heads
        self.scaling = args.head_dim ** -0.5
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False, dtype=dtype)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False, dtype=dtype)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False, dtype=dtype)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False, dtype=dtype)
        if args.qk_norm:
            self.q_norm = nn.RMSNorm(args.head_dim, eps=args.norm_eps, dtype=dtype)
            self.k_norm = nn.RMSNorm(args.head_dim, eps=args.norm_eps, dtype=dtype)
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
    def __init__(self, args: TitanArgs, dtype: torch.dtype | None = None):
        super().__init__()
        self.attention = Attention(args, dtype)
        self.feed_forward = FeedForward(args.dim, args.hidden_dim, dtype)
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps, dtype=dtype)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps, dtype=dtype)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis, mask)
        return h + self.feed_forward(self.ffn_norm(h))


def packed_mask(tokens: torch.Tensor, positions: torch.Tensor,
                cu_seqlens: torch.Tensor | None) -> torch.Tensor | None:
    """Validates the forward's inputs. None for plain rows (causal attention over each row);
    for a packed row the [T, T] boolean mask that lets query q see key k when both lie in the
    same sequence and k <= q."""
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be [B, T], got shape {tuple(tokens.shape)}")
    if positions.shape != tokens.shape:
        raise ValueError(f"positions shape {tuple(positions.shape)} != tokens shape "
                         f"{tuple(tokens.shape)}")
    if cu_seqlens is None:
        return None
    if tokens.shape[0] != 1:
        raise ValueError(f"with cu_seqlens the batch must be 1 row, got {tokens.shape[0]}")
    cu = [int(c) for c in cu_seqlens.tolist()]
    seqlen = tokens.shape[1]
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != seqlen or any(b <= a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens {cu} must rise strictly from 0 to T = {seqlen}")
    lengths = torch.tensor([b - a for a, b in zip(cu, cu[1:])], device=tokens.device)
    doc = torch.repeat_interleave(torch.arange(len(lengths), device=tokens.device), lengths)
    idx = torch.arange(seqlen, device=tokens.device)
    return (doc[:, None] == doc[None, :]) & (idx[None, :] <= idx[:, None])


class Decoder(nn.Module):
    """forward(tokens [B, T], positions [B, T], cu_seqlens [S + 1] | None, max_seqlen) ->
    logits [B, T, vocab_size] in the parameters' dtype (contract v1)."""

    def __init__(self, args: TitanArgs, dtype: torch.dtype | None = None):
        super().__init__()
        self.model_args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim,
                                           padding_idx=args.pad_token_id, dtype=dtype)
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(args, dtype) for i in range(args.n_layers)})
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps, dtype=dtype)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False, dtype=dtype)
        self.freqs_cis = FreqsCis(args.rope, args.head_dim, args.max_seq_len)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Tied: output.weight is the embedding Parameter (named_parameters yields it once)."""
        if self.model_args.tie_word_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor,
                cu_seqlens: torch.Tensor | None = None,
                max_seqlen: int | None = None) -> torch.Tensor:
        mask = packed_mask(tokens, positions, cu_seqlens)
        h = self.tok_embeddings(tokens)
        freqs_cis = self.freqs_cis(positions)
        for layer in self.layers.values():
            h = layer(h, freqs_cis, mask)
        return self.output(self.norm(h))


def build_decoder(args: TitanArgs, dtype: torch.dtype, device) -> Decoder:
    """Parameters in dtype on device, uninitialised (the worker assigns the checkpoint's)."""
    with torch.device("meta"):
        model = Decoder(args, dtype=dtype)
    model = model.to_empty(device=device)
    model.tie_weights()
    return model.eval()
