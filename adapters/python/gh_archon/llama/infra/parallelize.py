"""Tensor parallelism for Llama with torch.distributed.tensor.parallel: wq/wk/wv and the MLP's
w1/w3 column-sharded (whole heads per rank: local n_heads / n_kv_heads = global / tp), wo and w2
row-sharded (their partial outputs all-reduced). Embedding, norms and the output projection stay
replicated, so every rank returns the full logits. The all-reduce sums partial products in
another order than one GEMM: TP logits agree with TP=1 to rounding, not bit for bit."""

from __future__ import annotations

from torch import nn

from gh_archon.common.parallel import parallelize_decoder


def parallelize_llama(model: nn.Module, tp_mesh) -> nn.Module:
    return parallelize_decoder(model, tp_mesh)
