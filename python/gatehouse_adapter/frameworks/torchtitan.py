"""torchtitan (github.com/pytorch/torchtitan) as a Gatehouse ModelSpec.

A torchtitan model family is a ``TrainSpec`` (torchtitan/protocols/train_spec.py)::

    TrainSpec(model_cls, model_args={flavor: args}, parallelize_fn, pipelining_fn, ...,
              state_dict_adapter)

and :func:`model_spec` takes such an object (any object with ``model_cls``, ``model_args``,
``state_dict_adapter`` and ``parallelize_fn``) as it is:

config     torchtitan's args come from its own flavors, not from a Hugging Face config. The port
           gives ``args_from_hf(hf_config) -> args`` (or its args class a ``from_hf_config``
           classmethod), which receives transformers' config object, built by
           ``AutoConfig.for_model`` after the port's ``Fields`` checked config.json; when the args
           have a tie flag (``enable_weight_tying``, torchtitan's Qwen3) it must equal the
           config's ``tie_word_embeddings`` (a port without one serves untied checkpoints only).
model      ``model_cls(args)`` on the meta device, cast, materialised on the device,
           ``init_weights(buffer_device=device)`` (torchtitan computes its RoPE table there; the
           parameters it initialises are overwritten by the checkpoint's), the output projection
           tied to the embedding when the tie flag is set.
forward    torchtitan's ``forward(tokens, attention_masks=None, positions=None)`` (or
           ``forward(tokens)``): plain causal rows, documents only through its flex / varlen
           masks. An unpacked call passes ``positions`` (a forward without them must be asked
           for positions 0..T-1 of every row, else ValueError). A packed call (cu_seqlens) runs
           each sequence alone and concatenates the logits: attention never crosses a boundary.
weights    ``state_dict_adapter(args, None)`` (torchtitan's ``(model_args, hf_assets_path)``),
           held to contract v1 (``_common.ShimStateDictAdapter``): no key dropped or invented,
           the tied alias verified.
parallel   Gatehouse's 1-D mesh as torchtitan's ``ParallelDims`` (tp only) and a job config
           holding what its parallelize functions read (no loss parallelism, async TP, compile,
           activation checkpointing or FSDP; ``job_config=`` overrides sections), passed to
           ``parallelize_fn(model, parallel_dims, job_config)``; tied weights must still be one
           Parameter afterwards.
"""

from __future__ import annotations

import dataclasses
import tempfile
from typing import Any, Callable

import torch
from torch import nn

from gatehouse_adapter import ModelSpec
from gatehouse_adapter.config import Fields, field_error
from gatehouse_adapter.frameworks._common import (
    ShimStateDictAdapter, TensorParallelDims, after_parallelize, check_rows, gate_facts_from,
    give_contract_forward, is_tied, materialise, meta_aliases, namespace, read_config,
    recalled, remember, takes)

__all__ = ["model_spec", "job_config_for"]

TIE = (("output.weight", "tok_embeddings.weight"),)


def _call(framework_forward, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    if takes(framework_forward, "positions"):
        return framework_forward(tokens, positions=positions)
    expected = torch.arange(tokens.shape[1], device=positions.device).expand_as(positions)
    if not torch.equal(positions, expected):
        raise ValueError("this torchtitan model's forward takes no positions (it rotates "
                         "columns 0..T-1 of every row): asked for other positions")
    return framework_forward(tokens)


def forward(framework_forward, tokens, positions, cu_seqlens, max_seqlen):
    """Contract forward over torchtitan's (module docstring)."""
    cu = check_rows(tokens, positions, cu_seqlens)
    if cu is None:
        return _call(framework_forward, tokens, positions)
    return torch.cat([_call(framework_forward, tokens[:, a:b], positions[:, a:b])
                      for a, b in zip(cu[:-1], cu[1:])], dim=1)


def job_config_for(dims: TensorParallelDims, dtype: torch.dtype, **overrides: dict) -> Any:
    """What torchtitan's parallelize functions read of a JobConfig, for tensor parallelism only
    (attribute access; ``overrides`` replace whole sections)."""
    dtype_name = str(dtype).removeprefix("torch.")
    sections: dict[str, Any] = dict(
        training=dict(seq_len=dims.seq_len_divisor, mixed_precision_param=dtype_name,
                      mixed_precision_reduce="float32", enable_cpu_offload=False),
        parallelism=dict(tensor_parallel_degree=dims.tp, disable_loss_parallel=True,
                         enable_async_tensor_parallel=False, fsdp_reshard_after_forward="default",
                         data_parallel_replicate_degree=1, data_parallel_shard_degree=1,
                         context_parallel_degree=1, pipeline_parallel_degree=1,
                         expert_parallel_degree=1, expert_tensor_parallel_degree=1),
        compile=dict(enable=False, components=[]),
        activation_checkpoint=dict(mode="none"),
        model=dict(converters=[]),
        quantize=dict(linear=dict(float8=dict(recipe_name=None))),
        job=dict(dump_folder=tempfile.gettempdir()),
        debug=dict(moe_force_load_balance=False),
    )
    sections.update(overrides)
    return namespace(**sections)


def model_spec(train_spec: Any, *, name: str, model_types: tuple[str, ...], fields: Fields,
               args_from_hf: Callable[[Any], Any] | None = None, flavor: str | None = None,
               tie_flag: str = "enable_weight_tying",
               tie: tuple[tuple[str, str], ...] = TIE, job_config: dict | None = None,
               facts: dict[str, str] | None = None) -> ModelSpec:
    """The Gatehouse ModelSpec of a torchtitan ``TrainSpec``.

    name / model_types: the family name and the Hugging Face model_type values served.
    fields: what the port computes of config.json (gatehouse_adapter.Fields).
    args_from_hf: hf_config -> args; default: the args class's ``from_hf_config`` (the class of
        ``train_spec.model_args[flavor]``, flavor defaulting to the first).
    tie_flag / tie: the args' tie flag (absent: never tied) and the (alias, target) paths.
    job_config: {section: {field: value}} overrides of :func:`job_config_for`.
    facts: {gate fact: args attribute} where the args use other names than torchtitan's.
    """
    model_cls = getattr(train_spec, "model_cls", None)
    if model_cls is None:
        raise TypeError(f"{type(train_spec).__name__} has no model_cls: not a torchtitan "
                        "TrainSpec")
    if getattr(train_spec, "state_dict_adapter", None) is None:
        raise TypeError(f"{type(train_spec).__name__} has no state_dict_adapter: Gatehouse "
                        "loads Hugging Face checkpoints through it")
    if args_from_hf is None:
        flavors = dict(getattr(train_spec, "model_args", None) or {})
        if not flavors:
            raise TypeError("the TrainSpec has no model_args flavors; give args_from_hf=")
        args_class = type(flavors[flavor] if flavor else next(iter(flavors.values())))
        args_from_hf = getattr(args_class, "from_hf_config", None)
        if not callable(args_from_hf):
            raise TypeError(f"{args_class.__name__} has no from_hf_config; give args_from_hf=")
    if not fields.model_types:
        fields = dataclasses.replace(fields, model_types=tuple(model_types))

    def args_from_hf_config(config: dict) -> Any:
        hf = read_config(fields, config)
        args = args_from_hf(hf)
        tied = bool(getattr(args, tie_flag, False))
        wanted = bool(getattr(hf, "tie_word_embeddings", False))
        if tied != wanted:
            has = hasattr(args, tie_flag)
            raise field_error("tie_word_embeddings", wanted,
                              f"the framework's args have {tie_flag} = {tied}: it did not read "
                              "the tie flag" if has else
                              f"the framework's args have no {tie_flag}: this port computes "
                              "untied models only")
        return remember(args, hf_config=hf, tied=tied)

    def build_model(args: Any, dtype: torch.dtype, device: torch.device) -> nn.Module:
        with torch.device("meta"):
            model = model_cls(args)
        model = materialise(model, dtype, torch.device(device),
                            tie if recalled(args, "tied") else ())
        return give_contract_forward(model, forward).eval()

    def state_dict_adapter(args: Any) -> ShimStateDictAdapter:
        tied = recalled(args, "tied")
        aliases = meta_aliases(lambda: model_cls(args), tie, tied)
        return ShimStateDictAdapter(train_spec.state_dict_adapter(args, None), aliases, tied)

    def parallelize(model: nn.Module, tp_mesh: Any) -> nn.Module:
        tied = is_tied(model, tie)
        dims = TensorParallelDims(tp_mesh)
        jc = job_config_for(dims, next(model.parameters()).dtype, **(job_config or {}))
        result = train_spec.parallelize_fn(model, dims, jc)
        return after_parallelize(model, result, tie, tied, f"{name} parallelize_fn")

    return ModelSpec(
        name=name,
        model_types=tuple(model_types),
        args_from_hf_config=args_from_hf_config,
        config_accounting=fields.accounting,
        build_model=build_model,
        state_dict_adapter=state_dict_adapter,
        parallelize=parallelize if getattr(train_spec, "parallelize_fn", None) else None,
        gate_facts=lambda args: gate_facts_from(args, tie_flag, facts),
    )
