"""The parallelize_fn both Archon-style families share, in Archon's signature
(``parallelize_fn(model, parallel_dims, param_dtype, reduce_dtype, loss_parallel, cpu_offload,
reshard_after_forward_policy, ac_config, enable_compile)``), tensor parallelism only:

* q/k/v and w1/w3 column-sharded (whole heads per rank: the attention views with -1 heads,
  SDPA's enable_gqa follows the local head counts), wo and w2 row-sharded (partial outputs
  all-reduced); the embedding, the norms and the output projection replicated, so every rank
  computes the full logits (no sequence parallelism: a row of any length runs);
* per-head q/k norms (Qwen3) SequenceParallel over their head dimension, so their replicated
  weight's gradient is summed over the ranks;
* the output projection tied to the embedding afterwards when ``enable_weight_tying`` (Archon
  ties in its parallelize_fn).

Context parallelism, FSDP, pipeline parallelism, activation checkpointing and compile are not
ported: asked for, they raise NotImplementedError."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _divides(what: str, n: int, tp: int) -> None:
    if n % tp:
        raise ValueError(f"tensor parallel size {tp} does not divide {what} = {n}")


def apply_tp(model: nn.Module, tp_mesh: Any) -> None:
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    tp = tp_mesh.size()
    args = model.model_args
    _divides("num_attention_heads", args.n_heads, tp)
    _divides("num_key_value_heads", args.n_kv_heads, tp)
    _divides("intermediate_size", args.hidden_dim, tp)
    for block in model.layers.values():
        plan = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
                "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel()}
        if getattr(block.attention, "q_norm", None) is not None:
            plan["attention.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
            plan["attention.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        parallelize_module(block, tp_mesh, plan)


def parallelize_decoder(model: nn.Module, parallel_dims: Any,
                        param_dtype: torch.dtype = torch.bfloat16,
                        reduce_dtype: torch.dtype = torch.float32, loss_parallel: bool = True,
                        cpu_offload: bool = False, reshard_after_forward_policy: str = "default",
                        ac_config: Any = None, enable_compile: bool = True) -> nn.Module:
    for flag in ("cp_enabled", "fsdp_enabled", "pp_enabled", "ep_enabled"):
        if getattr(parallel_dims, flag, False):
            raise NotImplementedError(f"parallel_dims.{flag}: this port parallelizes over tp "
                                      "only")
    if enable_compile or (ac_config is not None and getattr(ac_config, "mode", "none") != "none"):
        raise NotImplementedError("this port's parallelize_fn applies neither torch.compile "
                                  "nor activation checkpointing")
    if parallel_dims.tp_enabled:
        apply_tp(model, parallel_dims.get_mesh("tp"))
    if getattr(model.model_args, "enable_weight_tying", False):
        model.output.weight = model.tok_embeddings.weight
    return model
