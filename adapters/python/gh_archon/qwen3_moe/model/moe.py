"""Qwen3-MoE sparse block as transformers 5.24 computes it by default: Qwen3MoeTopKRouter
(softmax in fp32 over the router logits, top-k, optional renormalisation, cast back) and the
experts through the "grouped_mm" experts implementation (integrations/moe.py
grouped_mm_experts_forward), which from_pretrained selects when none is requested.

Experts are stacked 3-D parameters as upstream holds them: gate and up fused,
``experts.w13`` [E, 2 * moe_inter_dim, dim] (rows [0, I) gate_proj, [I, 2I) up_proj; upstream's
gate_up_proj), and ``experts.w2`` [E, dim, moe_inter_dim] (down_proj). Archon keeps w1 and w3
apart; they are fused here because upstream projects gate and up with one GEMM and equality with
upstream must not depend on a GEMM kernel giving the same columns for N = I and N = 2I.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from gh_archon.common.layers import act_fn


def _torch_version() -> tuple[int, int, int]:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", torch.__version__)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else (0, 0, 0)


def _can_use_grouped_mm(input: torch.Tensor, weight: torch.Tensor) -> bool:
    """integrations/moe.py _can_use_grouped_mm, without the torch.compile / TPU branches."""
    version = _torch_version()
    if weight.device.type == "cpu" and (
            (version <= (2, 10, 0) and (weight.data_ptr() % 16 != 0 or input.data_ptr() % 16 != 0))
            or version <= (2, 8, 0)):
        return False
    if weight.device.type == "cuda":
        cap = torch.cuda.get_device_capability(weight.device)
        if hasattr(F, "grouped_mm"):
            return cap >= (8, 0)
        if hasattr(torch, "_grouped_mm"):
            return cap >= (8, 0) if version >= (2, 9, 0) else cap[0] == 9
        return False
    return hasattr(F, "grouped_mm") or hasattr(torch, "_grouped_mm")


def _grouped_mm_fallback(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor):
    output = torch.zeros(input.size(0), weight.size(2), device=input.device, dtype=input.dtype)
    start = 0
    for i, end in enumerate(offs.tolist()):
        if start == end:
            continue
        torch.mm(input[start:end], weight[i], out=output[start:end])
        start = end
    return output


def grouped_mm(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """input [S, K] sorted by expert, weight [E, K, N], offs [E] int32 cumulative -> [S, N]."""
    if _can_use_grouped_mm(input, weight):
        if hasattr(F, "grouped_mm"):
            return F.grouped_mm(input.to(weight.dtype), weight, offs=offs)
        return torch._grouped_mm(input.to(weight.dtype), weight, offs=offs)
    return _grouped_mm_fallback(input.to(weight.dtype), weight, offs)


class Router(nn.Module):
    """Qwen3MoeTopKRouter: gate [E, dim] (model.layers.N.mlp.gate.weight)."""

    def __init__(self, dim: int, num_experts: int, top_k: int, norm_topk_prob: bool,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.gate = nn.Linear(dim, num_experts, bias=False, dtype=dtype)
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob

    def forward(self, hidden_states: torch.Tensor):
        """[N, dim] -> (router_logits [N, E], top-k weights [N, k] in the logits' dtype,
        top-k expert ids [N, k])."""
        router_logits = F.linear(hidden_states, self.gate.weight)
        router_probs = F.softmax(router_logits, dtype=torch.float, dim=-1)
        router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
        router_top_value = router_top_value.to(router_logits.dtype)
        return router_logits, router_top_value, router_indices


class GroupedExperts(nn.Module):
    """The experts of one MoE layer, stacked: ``w13`` [E, 2 * hidden_dim, dim] (gate and up
    fused) and ``w2`` [E, dim, hidden_dim].

    forward(x [S, dim] with its rows grouped by expert in expert order, num_tokens_per_expert
    [E] int64) -> [S, dim], row for row: torchtitan's GroupedExperts interface, so an
    expert-parallel plan (gh_archon.common.expert_parallel) can move the rows between the
    ranks around it. Under that plan ``w13`` and ``w2`` are DTensors sharded over the experts
    (Shard(0)) and the rows are every EP rank's tokens for this rank's experts; the forward
    then runs on the local experts."""

    def __init__(self, dim: int, hidden_dim: int, num_experts: int, act: str,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.num_experts = num_experts
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * hidden_dim, dim, dtype=dtype))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden_dim, dtype=dtype))
        self.act = act_fn(act)

    def forward(self, x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        w13, w2 = _local(self.w13), _local(self.w2)
        offsets = torch.cumsum(num_tokens_per_expert, dim=0, dtype=torch.int32)
        proj_out = grouped_mm(x, w13.transpose(-2, -1), offsets)
        gate, up = proj_out.chunk(2, dim=-1)
        proj_out = self.act(gate) * up
        return grouped_mm(proj_out, w2.transpose(-2, -1), offsets)


def _local(w: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (its gradient flows back to the DTensor), else ``w``."""
    to_local = getattr(w, "to_local", None)
    return to_local() if to_local is not None else w


class MoE(nn.Module):
    """Qwen3MoeSparseMoeBlock: router + experts (no shared expert), computed as
    grouped_mm_experts_forward: the token copies (one per chosen expert) sorted by expert, the
    experts' grouped GEMMs, each row weighted by its routing weight, then put back in token
    order and summed over the k choices.

    ``tokens_per_expert`` [E] float32 (a buffer, as torchtitan's MoE keeps it for load
    balancing) accumulates the tokens this rank routed to each expert, every forward, until
    the caller zeroes it; ``router_near_ties`` [] int64 the tokens whose k-th and (k+1)-th
    router logits lie within 2 units in the last place of the logits' dtype (ties included):
    where rounding upstream of the router decides the choice (Gatehouse's parallel gate tells
    such flips from bugs with it)."""

    def __init__(self, dim: int, hidden_dim: int, num_experts: int, top_k: int,
                 norm_topk_prob: bool, act: str, dtype: torch.dtype | None = None):
        super().__init__()
        self.router = Router(dim, num_experts, top_k, norm_topk_prob, dtype=dtype)
        self.experts = GroupedExperts(dim, hidden_dim, num_experts, act, dtype=dtype)
        self.register_buffer("tokens_per_expert", torch.zeros(num_experts, dtype=torch.float32),
                             persistent=False)
        self.register_buffer("router_near_ties", torch.zeros((), dtype=torch.int64),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch_size, sequence_length, hidden_dim = x.shape
        h = x.view(-1, hidden_dim)
        router_logits, routing_weights, selected_experts = self.router(h)
        num_tokens, num_top_k = selected_experts.shape
        num_experts = self.experts.num_experts
        if num_top_k < num_experts:
            with torch.no_grad():
                top = torch.topk(router_logits.float(), num_top_k + 1, dim=-1).values
                kth, after = top[:, num_top_k - 1], top[:, num_top_k]
                ulp = torch.finfo(router_logits.dtype).eps
                near = (kth - after) <= torch.maximum(kth.abs(), after.abs()) * (2 * ulp)
                self.router_near_ties.add_(near.sum())

        expert_ids = selected_experts.reshape(-1)
        expert_ids_g, perm = torch.sort(expert_ids)
        histc_input = expert_ids_g.float() if x.device.type in ("cpu", "mps") else expert_ids_g.int()
        counts = torch.histc(histc_input, bins=num_experts, min=0, max=num_experts - 1)
        with torch.no_grad():
            self.tokens_per_expert.add_(counts.to(self.tokens_per_expert.dtype))

        proj_out = self.experts(h[perm // num_top_k], counts.to(torch.int64))
        weighted_out = proj_out * routing_weights.reshape(-1)[perm].unsqueeze(-1)
        inv_perm = torch.empty_like(perm)
        inv_perm[perm] = torch.arange(perm.size(0), device=x.device)
        out = weighted_out[inv_perm].view(num_tokens, num_top_k, hidden_dim).sum(dim=1)
        return out.to(x.dtype).reshape(batch_size, sequence_length, hidden_dim)
