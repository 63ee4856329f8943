"""The parallelize function both gh_titan families share, in torchtitan's signature
(``parallelize_fn(model, parallel_dims, job_config)``), tensor parallelism only: wq/wk/wv and
w1/w3 column-sharded (whole heads per rank; the attention views with -1 heads), wo and w2
row-sharded, Qwen3's per-head q/k norms SequenceParallel over their heads (their replicated
weight's gradient summed over the ranks); embedding, norms and output replicated, so every rank
computes the full logits for a row of any length (no sequence parallelism, no loss parallelism).
Context / data / pipeline parallelism, compile and activation checkpointing are not ported and
raise NotImplementedError when the job config asks for them."""

from __future__ import annotations

from typing import Any

from torch import nn


def _divides(what: str, n: int, tp: int) -> None:
    if n % tp:
        raise ValueError(f"tensor parallel size {tp} does not divide {what} = {n}")


def parallelize_decoder(model: nn.Module, parallel_dims: Any, job_config: Any) -> nn.Module:
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    for flag in ("cp_enabled", "fsdp_enabled", "pp_enabled", "ep_enabled"):
        if getattr(parallel_dims, flag, False):
            raise NotImplementedError(f"parallel_dims.{flag}: this port parallelizes over tp only")
    if job_config.compile.enable or job_config.activation_checkpoint.mode != "none":
        raise NotImplementedError("this port applies neither compile nor activation "
                                  "checkpointing")
    if not parallel_dims.tp_enabled:
        return model
    tp_mesh = parallel_dims.get_mesh("tp")
    tp, args = tp_mesh.size(), model.model_args
    _divides("num_attention_heads", args.n_heads, tp)
    _divides("num_key_value_heads", args.n_kv_heads, tp)
    _divides("intermediate_size", args.hidden_dim, tp)
    for block in model.layers.values():
        plan = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
                "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel()}
        if block.attention.q_norm is not None:
            plan["attention.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
            plan["attention.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        parallelize_module(block, tp_mesh, plan)
    return model
