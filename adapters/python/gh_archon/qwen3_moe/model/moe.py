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
    def __init__(self, dim: int, hidden_dim: int, num_experts: int, act: str,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.num_experts = num_experts
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * hidden_dim, dim, dtype=dtype))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden_dim, dtype=dtype))
        self.act = act_fn(act)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        """grouped_mm_experts_forward: hidden [N, dim], ids/weights [N, k] -> [N, dim]."""
        device = hidden_states.device
        num_top_k = top_k_index.size(-1)
        num_tokens = hidden_states.size(0)
        hidden_dim = hidden_states.size(-1)

        sample_weights = top_k_weights.reshape(-1)
        expert_ids = top_k_index.reshape(-1)
        expert_ids_g, perm = torch.sort(expert_ids)
        selected_hidden_states_g = hidden_states[perm // num_top_k]
        sample_weights_g = sample_weights[perm]

        histc_input = expert_ids_g.float() if device.type in ("cpu", "mps") else expert_ids_g.int()
        tokens_per_expert = torch.histc(histc_input, bins=self.num_experts, min=0,
                                        max=self.num_experts - 1)
        offsets = torch.cumsum(tokens_per_expert, dim=0, dtype=torch.int32)

        proj_out = grouped_mm(selected_hidden_states_g, self.w13.transpose(-2, -1), offsets)
        gate, up = proj_out.chunk(2, dim=-1)
        proj_out = self.act(gate) * up
        proj_out = grouped_mm(proj_out, self.w2.transpose(-2, -1), offsets)

        weighted_out = proj_out * sample_weights_g.unsqueeze(-1)
        inv_perm = torch.empty_like(perm)
        inv_perm[perm] = torch.arange(perm.size(0), device=device)
        weighted_out = weighted_out[inv_perm]
        final_hidden_states = weighted_out.view(num_tokens, num_top_k, hidden_dim).sum(dim=1)
        return final_hidden_states.to(hidden_states.dtype)


class MoE(nn.Module):
    """Qwen3MoeSparseMoeBlock: router + experts (no shared expert)."""

    def __init__(self, dim: int, hidden_dim: int, num_experts: int, top_k: int,
                 norm_topk_prob: bool, act: str, dtype: torch.dtype | None = None):
        super().__init__()
        self.router = Router(dim, num_experts, top_k, norm_topk_prob, dtype=dtype)
        self.experts = GroupedExperts(dim, hidden_dim, num_experts, act, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch_size, sequence_length, hidden_dim = x.shape
        h = x.view(-1, hidden_dim)
        _, routing_weights, selected_experts = self.router(h.reshape(-1, hidden_dim))
        out = self.experts(h, selected_experts, routing_weights)
        return out.reshape(batch_size, sequence_length, hidden_dim)
