"""Tensor parallelism for Qwen3-MoE with torch.distributed.tensor.parallel: attention wq/wk/wv
column-sharded (whole heads per rank; q_norm / k_norm act per head: their weight stays whole on
every rank, a replicated DTensor whose gradient is summed over the ranks) and wo row-sharded; dense layers' w1/w3 column-, w2 row-sharded. Sparse layers' router and experts
stay replicated (every rank routes the full, replicated hidden states through all experts): the
expert weights are not split. Embedding, norms and the output projection stay replicated."""

from __future__ import annotations

from torch import nn

from gh_archon.common.parallel import parallelize_decoder


def parallelize_qwen3_moe(model: nn.Module, tp_mesh) -> nn.Module:
    return parallelize_decoder(model, tp_mesh)
