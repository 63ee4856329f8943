"""AReaL's Archon (github.com/inclusionAI/AReaL, areal/experimental/models/archon) as a Gatehouse
ModelSpec.

An Archon model family is a ``ModelSpec`` (areal/experimental/models/archon/model_spec.py)::

    ModelSpec(name, model_class, model_args_class, state_dict_adapter_class, parallelize_fn,
              supported_model_types, pipelining_fn=None)

and :func:`model_spec` takes such an object (any object with those attributes) as it is:

config     ``model_args_class.from_hf_config(hf_config, **args_kwargs)`` receives transformers'
           config object, built from config.json by ``AutoConfig.for_model`` after the port's
           ``Fields`` checked it; the args' ``enable_weight_tying`` must equal the config's
           ``tie_word_embeddings``.
model      ``model_class(args)`` on the meta device, cast to the cell's dtype, materialised on
           the device, ``init_buffers(device)`` (the RoPE cache), the output projection tied to
           the embedding when ``enable_weight_tying`` (Archon ties in parallelize_fn; the worker
           loads weights before it parallelizes).
forward    Archon's ``forward(tokens, positions, cu_seqlens, max_seqlen)`` requires
           cu_seqlens. A packed call passes it through (int32, max_seqlen computed when None).
           An unpacked call [B, T] runs each row as a packed row of one sequence
           (cu_seqlens = [0, T]) and stacks the logits (``unpacked="rows"``, the default: equal
           to per-row packed calls), or packs the B rows into one row of B sequences
           (``unpacked="pack"``, as Archon's engine feeds it; equal up to the kernels' rounding).
weights    ``state_dict_adapter_class(hf_config, None)``, held to contract v1 (see
           ``_common.ShimStateDictAdapter``): Archon's adapters skip keys they do not know
           (``from_hf_map`` entries mapped to None) and add ``lm_head.weight`` when tied; here a
           dropped key is refused by name and the tied alias verified.
parallel   Gatehouse's 1-D mesh as an ``ArchonParallelDims`` with tp only, passed to
           ``parallelize_fn(model, parallel_dims, param_dtype=<the model's>, reduce_dtype=fp32,
           loss_parallel=False, cpu_offload=False, ac_config=None, enable_compile=False)``
           (every rank must get the full logits: no loss parallelism); tied weights must still be
           one Parameter afterwards.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from gatehouse_adapter import ModelSpec
from gatehouse_adapter.config import Fields
from gatehouse_adapter.frameworks._common import (
    ShimStateDictAdapter, TensorParallelDims, after_parallelize, check_rows, check_tie_flag,
    gate_facts_from, give_contract_forward, is_tied, materialise, meta_aliases, read_config, recalled,
    remember)

__all__ = ["model_spec", "UNPACKED"]

UNPACKED = ("rows", "pack")
TIE = (("output.weight", "tok_embeddings.weight"),)


def _packed(framework_forward, tokens, positions, cu, max_seqlen):
    cu_t = torch.tensor(cu, dtype=torch.int32, device=tokens.device)
    if max_seqlen is None:
        max_seqlen = max(b - a for a, b in zip(cu, cu[1:]))
    return framework_forward(tokens, positions, cu_t, int(max_seqlen))


def forward_rows(framework_forward, tokens, positions, cu_seqlens, max_seqlen):
    """Contract forward over Archon's: unpacked rows one by one, each as one packed sequence."""
    cu = check_rows(tokens, positions, cu_seqlens)
    if cu is not None:
        return _packed(framework_forward, tokens, positions, cu, max_seqlen)
    t = tokens.shape[1]
    return torch.cat([_packed(framework_forward, tokens[b:b + 1], positions[b:b + 1], [0, t], t)
                      for b in range(tokens.shape[0])], dim=0)


def forward_pack(framework_forward, tokens, positions, cu_seqlens, max_seqlen):
    """Contract forward over Archon's: unpacked rows packed into one row of B sequences."""
    cu = check_rows(tokens, positions, cu_seqlens)
    if cu is not None:
        return _packed(framework_forward, tokens, positions, cu, max_seqlen)
    b, t = tokens.shape
    out = _packed(framework_forward, tokens.reshape(1, b * t), positions.reshape(1, b * t),
                  [i * t for i in range(b + 1)], t)
    return out.reshape(b, t, -1)


def model_spec(spec: Any, *, fields: Fields, name: str | None = None,
               model_types: tuple[str, ...] | None = None, args_kwargs: dict | None = None,
               tie_flag: str = "enable_weight_tying",
               tie: tuple[tuple[str, str], ...] = TIE, unpacked: str = "rows",
               parallelize_kwargs: dict | None = None,
               facts: dict[str, str] | None = None) -> ModelSpec:
    """The Gatehouse ModelSpec of an Archon ``ModelSpec``.

    fields: what the port computes of config.json (gatehouse_adapter.Fields).
    name / model_types: default to ``spec.name.lower()`` / ``spec.supported_model_types``.
    args_kwargs: extra keyword arguments of ``from_hf_config`` (e.g. ``attn_type="sdpa"``).
    tie_flag / tie: the args' tie flag and the (alias, target) parameter paths it ties.
    unpacked: "rows" or "pack" (module docstring).
    parallelize_kwargs: overrides of parallelize_fn's keyword arguments.
    facts: {gate fact: args attribute} where the args use other names than Archon's.
    """
    for attr in ("model_class", "model_args_class", "state_dict_adapter_class"):
        if getattr(spec, attr, None) is None:
            raise TypeError(f"{type(spec).__name__} has no {attr}: not an Archon ModelSpec")
    if not callable(getattr(spec.model_args_class, "from_hf_config", None)):
        raise TypeError(f"{spec.model_args_class.__name__} has no from_hf_config")
    if unpacked not in UNPACKED:
        raise ValueError(f"unpacked={unpacked!r}: expected one of {UNPACKED}")
    name = name or str(spec.name).lower()
    model_types = tuple(sorted(model_types or spec.supported_model_types))
    if not fields.model_types:
        fields = dataclasses.replace(fields, model_types=model_types)
    args_kwargs = dict(args_kwargs or {})
    forward = forward_rows if unpacked == "rows" else forward_pack

    def args_from_hf_config(config: dict) -> Any:
        hf = read_config(fields, config)
        args = spec.model_args_class.from_hf_config(hf, **args_kwargs)
        tied = check_tie_flag(args, tie_flag, hf)
        return remember(args, hf_config=hf, tied=tied)

    def build_model(args: Any, dtype: torch.dtype, device: torch.device) -> nn.Module:
        with torch.device("meta"):
            model = spec.model_class(args)
        model = materialise(model, dtype, torch.device(device),
                            tie if recalled(args, "tied") else ())
        return give_contract_forward(model, forward).eval()

    def state_dict_adapter(args: Any) -> ShimStateDictAdapter:
        tied = recalled(args, "tied")
        aliases = meta_aliases(lambda: spec.model_class(args), tie, tied)
        framework = spec.state_dict_adapter_class(recalled(args, "hf_config"), None)
        return ShimStateDictAdapter(framework, aliases, tied)

    def parallelize(model: nn.Module, tp_mesh: Any) -> nn.Module:
        tied = is_tied(model, tie)
        kwargs = dict(param_dtype=next(model.parameters()).dtype, reduce_dtype=torch.float32,
                      loss_parallel=False, cpu_offload=False, ac_config=None,
                      enable_compile=False)
        kwargs.update(parallelize_kwargs or {})
        result = spec.parallelize_fn(model, TensorParallelDims(tp_mesh), **kwargs)
        return after_parallelize(model, result, tie, tied, f"{name} parallelize_fn")

    return ModelSpec(
        name=name,
        model_types=model_types,
        args_from_hf_config=args_from_hf_config,
        config_accounting=fields.accounting,
        build_model=build_model,
        state_dict_adapter=state_dict_adapter,
        parallelize=parallelize if getattr(spec, "parallelize_fn", None) is not None else None,
        gate_facts=lambda args: gate_facts_from(args, tie_flag, facts),
    )

