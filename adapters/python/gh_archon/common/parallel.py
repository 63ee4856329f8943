"""Tensor-parallel plan shared by the decoders of this package (Megatron style, via
torch.distributed.tensor.parallel): attention q/k/v and the dense MLP's w1/w3 ColwiseParallel,
attention wo and the MLP's w2 RowwiseParallel. Colwise outputs are local tensors holding whole
heads (the attention views with -1 heads), Rowwise outputs are replicated (all-reduce).

Per-head norms (Qwen3's q_norm / k_norm) see only this rank's heads, so each rank's gradient of
their replicated weight is a partial sum: they are SequenceParallel over dim 2 of their
[B, T, heads, head_dim] input (torchtitan's plan for Qwen3), which makes the weight a replicated
DTensor whose gradient DTensor sums over the ranks. Left plain, every rank would keep its own
partial gradient and the ranks' copies of the weight would drift apart after one step."""

from __future__ import annotations

from torch import nn


def _divides(what: str, n: int, tp: int) -> None:
    if n % tp:
        raise ValueError(f"tensor parallel size {tp} does not divide {what} = {n}")


def parallelize_decoder(model: nn.Module, tp_mesh) -> nn.Module:
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    tp = tp_mesh.size()
    if tp == 1:
        return model
    args = model.model_args
    _divides("num_attention_heads", args.n_heads, tp)
    _divides("num_key_value_heads", args.n_kv_heads, tp)
    for layer in model.layers.values():
        plan = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(),
        }
        if getattr(layer.attention, "q_norm", None) is not None:
            plan.update({
                "attention.q_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
                "attention.k_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
            })
        if getattr(layer, "feed_forward", None) is not None:
            _divides("intermediate_size", args.hidden_dim, tp)
            plan.update({
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w3": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(),
            })
        parallelize_module(layer, tp_mesh, plan)
    return model


def fully_shard_decoder(model: nn.Module, dp_mesh) -> nn.Module:
    """Data parallelism as torchtitan's apply_fsdp lays it out: FSDP2 ``fully_shard`` on each
    decoder layer, then on the root (embedding, final norm, output; a tied embedding stays one
    parameter), each parameter Shard(0) over ``dp_mesh``. Gradients are reduce-scattered in
    fp32 (``reduce_dtype``) and summed, not averaged (divide factor 1): the trainer's loss is
    each rank's token sum over the global token count, as torchtitan's
    ``disable_fsdp_gradient_division`` has it. Experts an expert-parallel plan split over an
    "ep" mesh are left to that plan (``ignored_params``)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from gh_archon.common.expert_parallel import expert_parallel_parameters

    policy = MixedPrecisionPolicy(reduce_dtype=torch.float32)
    ignored = expert_parallel_parameters(model)
    for module in [*model.layers.values(), model]:
        fully_shard(module, mesh=dp_mesh, mp_policy=policy, ignored_params=ignored or None)
        # A plain SUM (no division, no NCCL PreMulSum, which gloo lacks).
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)
    return model
