"""Parallelism for Qwen3-MoE.

Tensor parallelism with torch.distributed.tensor.parallel: attention wq/wk/wv column-sharded
(whole heads per rank; q_norm / k_norm act per head: their weight stays whole on every rank, a
replicated DTensor whose gradient is summed over the ranks) and wo row-sharded; dense layers'
w1/w3 column-, w2 row-sharded. Sparse layers' router and experts stay replicated over tp (every
rank routes the full, replicated hidden states through its experts). Embedding, norms and the
output projection stay replicated.

Expert parallelism (applied after tensor parallelism, before data parallelism, Archon's order):
each sparse layer's experts split over the EP group, tokens dispatched to them all-to-all and
combined back (gh_archon.common.expert_parallel)."""

from __future__ import annotations

from torch import nn

from gh_archon.common.expert_parallel import ExpertParallel, sum_expert_gradients
from gh_archon.common.parallel import parallelize_decoder


def parallelize_qwen3_moe(model: nn.Module, tp_mesh) -> nn.Module:
    return parallelize_decoder(model, tp_mesh)


def expert_parallelize_qwen3_moe(model: nn.Module, ep_mesh, expert_dp_mesh) -> nn.Module:
    """Splits every sparse layer's experts over ``ep_mesh`` (1-D, "ep"); where other
    data-parallel ranks hold the same experts (``expert_dp_mesh``, "dp_mod_ep", more than one
    rank), their gradients are summed over them."""
    experts = []
    for layer in model.layers.values():
        if layer.moe is not None:
            ExpertParallel(ep_mesh).apply(layer.moe.experts)
            experts += list(layer.moe.experts.parameters())
    sum_expert_gradients(experts, expert_dp_mesh)
    return model
