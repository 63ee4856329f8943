"""Dense Qwen3 as AReaL's Archon computes it (areal/experimental/models/archon/qwen3/model/
model.py, itself adapted from torchtitan), behind Gatehouse's forward (contract v1).

Numerical choices kept from AReaL (they differ from transformers' eager path by rounding):
  * RoPE from a precomputed fp32 cos|sin cache, applied in the [B, T, H, D] layout before the
    heads are transposed (rope.py);
  * attention through AReaL's backends: "varlen" (flash attention over the packed row, AReaL's
    default) where it runs, else "sdpa" (scaled_dot_product_attention with a float
    block-causal mask and enable_gqa); never an eager softmax;
  * RMSNorm with fp32 variance, weight applied after the cast back (also q_norm / k_norm on
    [B, T, H, D] per head before RoPE); SwiGLU w2(silu(w1 x) * w3 x); no biases anywhere.

Unpacked rows (cu_seqlens None): AReaL's forward always takes cu_seqlens (its engine packs
every batch into one row). Here each row is one sequence: for "sdpa" the batch keeps its rows
and shares the mask of cu_seqlens = [0, T] (plain causal); for "varlen" the rows are packed
into one (cu_seqlens = [0, T, 2T, ...]) as AReaL's engine would, and the logits unpacked.

Parameter names are AReaL's:
  tok_embeddings.weight                 model.embed_tokens.weight
  layers.N.attention_norm.weight        model.layers.N.input_layernorm.weight
  layers.N.attention.w{q,k,v,o}.weight  model.layers.N.self_attn.{q,k,v,o}_proj.weight
  layers.N.attention.{q,k}_norm.weight  model.layers.N.self_attn.{q,k}_norm.weight
  layers.N.ffn_norm.weight              model.layers.N.post_attention_layernorm.weight
  layers.N.feed_forward.w1/w3/w2.weight model.layers.N.mlp.gate/up/down_proj.weight
  norm.weight                           model.norm.weight
  output.weight                         lm_head.weight (tied: the embedding Parameter itself,
                                        as AReaL's parallelize_qwen3 ties it)
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from gh_areal.attention import SDPAWrapper, VarlenAttentionWrapper, varlen_available
from gh_areal.qwen3.model.args import ATTN_TYPES, Qwen3ModelArgs
from gh_areal.qwen3.model.rope import apply_rotary_emb, check_positions, precompute_rope_cache

ATTN_ENV = "GH_AREAL_ATTN"


class RMSNorm(nn.Module):
    """fp32 mean of squares, rsqrt(var + eps), cast back to the input dtype, then weight *."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x.to(input_dtype)


class Attention(nn.Module):
    """GQA attention with per-head q/k RMSNorm; no biases."""

    def __init__(self, args: Qwen3ModelArgs, dtype: torch.dtype | None = None):
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.head_dim = args.head_dim
        self.scaling = self.head_dim ** -0.5
        self.q_norm = RMSNorm(self.head_dim, eps=args.norm_eps, dtype=dtype)
        self.k_norm = RMSNorm(self.head_dim, eps=args.norm_eps, dtype=dtype)
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False, dtype=dtype)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False, dtype=dtype)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False, dtype=dtype)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False, dtype=dtype)
        self.sdpa = SDPAWrapper()
        self.varlen = VarlenAttentionWrapper()

    def forward(self, x: torch.Tensor, rope_cache: torch.Tensor, positions: torch.Tensor,
                cu_seqlens: torch.Tensor, max_seqlen: int | None, attn_type: str
                ) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        xq = self.q_norm(xq)
        xk = self.k_norm(xk)
        xq, xk = apply_rotary_emb(xq, xk, rope_cache, positions)
        xq, xk, xv = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
        backend = self.varlen if attn_type == "varlen" else self.sdpa
        out = backend(xq, xk, xv, scale=self.scaling, cu_seqlens=cu_seqlens,
                      max_seqlen=max_seqlen)
        out = out.transpose(1, 2).contiguous()
        return self.wo(out.view(bs, seqlen, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden_dim: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False, dtype=dtype)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False, dtype=dtype)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: Qwen3ModelArgs, dtype: torch.dtype | None = None):
        super().__init__()
        self.layer_id = layer_id
        self.attention = Attention(args, dtype=dtype)
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps, dtype=dtype)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps, dtype=dtype)
        self.feed_forward = FeedForward(args.dim, args.hidden_dim, dtype=dtype)

    def forward(self, x, rope_cache, positions, cu_seqlens, max_seqlen, attn_type):
        x = x + self.attention(self.attention_norm(x), rope_cache, positions, cu_seqlens,
                               max_seqlen, attn_type)
        return x + self.feed_forward(self.ffn_norm(x))


def _resolve_attn_type(default: str) -> str:
    forced = os.environ.get(ATTN_ENV)
    if forced:
        if forced not in ATTN_TYPES:
            raise ValueError(f"{ATTN_ENV}={forced!r}: expected one of {', '.join(ATTN_TYPES)}")
        return forced
    return default


def _check_cu_seqlens(tokens: torch.Tensor, positions: torch.Tensor,
                      cu_seqlens: torch.Tensor | None) -> None:
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be [B, T], got shape {tuple(tokens.shape)}")
    if positions.shape != tokens.shape:
        raise ValueError(f"positions shape {tuple(positions.shape)} != tokens shape "
                         f"{tuple(tokens.shape)}")
    if cu_seqlens is None:
        return
    if tokens.shape[0] != 1:
        raise ValueError(f"with cu_seqlens the batch must be 1 row, got {tokens.shape[0]}")
    cu = [int(c) for c in cu_seqlens.tolist()]
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != tokens.shape[1] or any(
            b <= a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens {cu} must rise strictly from 0 to T = {tokens.shape[1]}")


class Qwen3Model(nn.Module):
    """forward(tokens [B, T], positions [B, T], cu_seqlens [S + 1] | None, max_seqlen) ->
    logits [B, T, vocab_size] in the parameters' dtype (contract v1, gatehouse_adapter)."""

    def __init__(self, args: Qwen3ModelArgs, dtype: torch.dtype | None = None):
        super().__init__()
        self.model_args = args
        self.attn_type = _resolve_attn_type(args.attn_type)
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim, dtype=dtype)
        self.register_buffer("rope_cache", self._precompute_rope_cache(), persistent=False)
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(i, args, dtype) for i in range(args.n_layers)})
        self.norm = RMSNorm(args.dim, eps=args.norm_eps, dtype=dtype)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False, dtype=dtype)
        self.tie_weights()

    def _precompute_rope_cache(self) -> torch.Tensor:
        return precompute_rope_cache(self.model_args.head_dim, self.model_args.max_seq_len,
                                     self.model_args.rope_theta)

    def init_buffers(self, buffer_device: torch.device | str) -> None:
        """The fp32 RoPE cache computed on buffer_device (AReaL's init_buffers, called after the
        parameters are materialised and cast)."""
        with torch.device(buffer_device):
            self.rope_cache = self._precompute_rope_cache()

    def tie_weights(self) -> None:
        if self.model_args.enable_weight_tying:
            self.output.weight = self.tok_embeddings.weight

    def _attn_type_for(self, h: torch.Tensor) -> str:
        if self.attn_type == "varlen" and not varlen_available(h.device, h.dtype):
            if os.environ.get(ATTN_ENV) == "varlen":
                raise ValueError(f"{ATTN_ENV}=varlen: flash varlen attention needs CUDA and "
                                 f"fp16/bf16, got {h.device.type} {h.dtype}")
            return "sdpa"
        return self.attn_type

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor,
                cu_seqlens: torch.Tensor | None = None,
                max_seqlen: int | None = None) -> torch.Tensor:
        _check_cu_seqlens(tokens, positions, cu_seqlens)
        check_positions(self.rope_cache, positions)
        if isinstance(max_seqlen, torch.Tensor):
            max_seqlen = int(max_seqlen.item())
        h = self.tok_embeddings(tokens)
        attn_type = self._attn_type_for(h)
        bs, seqlen = tokens.shape
        unpack = None
        if cu_seqlens is None:
            if attn_type == "varlen" and bs > 1:
                # AReaL's engine packs every batch into one row: so do we, then unpack.
                h = h.reshape(1, bs * seqlen, -1)
                positions = positions.reshape(1, bs * seqlen)
                unpack = (bs, seqlen)
                cu_seqlens = torch.arange(0, bs + 1, device=tokens.device,
                                          dtype=torch.int32) * seqlen
            else:
                cu_seqlens = torch.tensor([0, seqlen], device=tokens.device, dtype=torch.int32)
            max_seqlen = seqlen
        elif cu_seqlens.ndim == 2:
            cu_seqlens = cu_seqlens.squeeze(0)
        for layer in self.layers.values():
            h = layer(h, self.rope_cache, positions, cu_seqlens, max_seqlen, attn_type)
        h = self.norm(h)
        logits = self.output(h)
        if unpack is not None:
            logits = logits.reshape(*unpack, -1)
        return logits


def build_model(args: Qwen3ModelArgs, dtype: torch.dtype, device) -> Qwen3Model:
    """As AReaL's engine builds it: the structure on the meta device, cast to the training
    dtype, materialised uninitialised on the device (the worker assigns the checkpoint's
    weights), then the fp32 RoPE cache computed there."""
    device = torch.device(device)
    with torch.device("meta"):
        model = Qwen3Model(args, dtype=dtype)
    model = model.to(dtype).to_empty(device=device)
    model.tie_weights()
    model.init_buffers(device)
    return model.eval()
