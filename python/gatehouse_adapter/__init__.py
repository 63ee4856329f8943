"""Gatehouse Python adapter contract, version 1.

A Python-lane adapter is a module that exposes ``SPEC``, a :class:`ModelSpec`. The Gatehouse
worker (which embeds the interpreter) imports it and runs the same gates as for the C++
families: config accounting, load coverage, logits parity against transformers, decode (KV-cached
where ``init_cache`` / ``decode_forward`` are given), training, save/reload and, where
``parallelize`` is given, tensor parallelism.

This package is pure Python and depends only on torch. Beside the contract it holds what every
adapter needs and no framework ships: :class:`ConfigReader` and :class:`Fields`
(``gatehouse_adapter.config``: typed config.json reads whose ValueErrors name the field and the
value, and the config gate's accounting), :class:`KeyMap` (``gatehouse_adapter.names``:
checkpoint <-> model name templates), and ``gatehouse_adapter.frameworks`` (shims that present a
framework's own model spec, torchtitan's or AReaL Archon's, as a :class:`ModelSpec`; imported on
demand, they need transformers).

Shapes and dtypes
-----------------
The model returned by ``build_model(args, dtype, device)`` is a ``torch.nn.Module`` whose
parameters are in ``dtype`` on ``device`` (values unspecified until weights are assigned) and
whose forward is Archon's::

    forward(tokens: LongTensor [B, T],
            positions: LongTensor [B, T],
            cu_seqlens: Tensor [S + 1] (int32 or int64) | None = None,
            max_seqlen: int | None = None) -> logits [B, T, vocab_size] in ``dtype``

* Without ``cu_seqlens`` each row is one sequence: plain causal attention over the row (plus the
  sliding window where the config asks for one), columns counted from 0.
* With ``cu_seqlens``, ``B == 1`` and the row holds ``S`` sequences back to back: sequence ``s``
  occupies columns ``[cu_seqlens[s], cu_seqlens[s + 1])``, ``cu_seqlens[0] == 0`` and
  ``cu_seqlens[-1] == T``; ``positions`` restart at 0 for each sequence; attention never crosses
  a sequence boundary (block-diagonal causal mask; the sliding window too, inside each block).
  ``max_seqlen`` (the longest sequence) is a hint and may be None.

Numerics: the model computes upstream's function; its order of floating-point operations is
its own (SDPA or flash attention, complex or rotate-half RoPE, fused projections, a fused
RMSNorm). The gates hold it to margins over the envelope of correct implementations the
reference bundle carries (upstream's own spread under those choices on the same checkpoint):
inside them is "correct". Bit-equal logits and traces (reached by following upstream's modeling
file op for op on the same device kind, kernels and thread count) are reported as "bit-exact",
a claim of its own; against a bundle without an envelope equality is the bar.

Weights
-------
``state_dict_adapter(args)`` returns a :class:`StateDictAdapter`. ``from_hf`` takes the
checkpoint's tensors (all safetensors shards merged: ``{hf_key: Tensor}``, any dtype, the
worker casts to the model dtype afterwards) and returns ``{model_parameter_name: Tensor}``.
The worker checks coverage both ways, so ``from_hf`` must neither drop nor invent keys:

* every checkpoint key is consumed: mapped to a parameter, or (tied embeddings only) an alias
  that is verified equal to the tensor it aliases; an unknown key raises ``KeyError`` /
  ``ValueError`` naming it;
* every model parameter (``model.named_parameters()``, duplicates removed) is assigned;
* shapes are equal (the worker compares them; from_hf may reshape/stack, e.g. per-expert 2-D
  weights into 3-D stacks, but never pads or slices away data).

Tied embeddings: when ``tie_word_embeddings`` is true the checkpoint may lack
``lm_head.weight`` (``save_pretrained`` omits it). The module ties its output projection to the
embedding (the same ``Parameter`` object), so ``named_parameters()`` yields it once, under the
embedding's name, and ``from_hf`` returns only that name.

``to_hf(sd)`` is the inverse: given ``{model_parameter_name: Tensor}`` it returns exactly the
checkpoint's keys (``save_pretrained``'s naming; tied: no ``lm_head.weight`` unless the
checkpoint read by ``from_hf`` had one) with bit-equal tensors. ``convert_single_to_hf(name,
tensor)`` (optional) converts one parameter for incremental weight sync and returns
``[(hf_key, tensor), ...]``.

Config accounting
-----------------
``config_accounting(config)`` maps each top-level ``config.json`` field the adapter knows to
``None`` (mapped: it changes the computation and is honoured) or a string (ignored, with the
reason it does not change the computation). A field absent from the result is *unmapped* and
the config gate FAILs on it. ``args_from_hf_config(config)`` raises ``ValueError`` naming the
field and the value for anything bad or unsupported (a value upstream would compute and the
adapter does not must never be silently accepted).

KV-cache decode (optional)
--------------------------
An adapter may own a KV cache, as an inference engine does (vLLM's ``kv_cache``; Archon's
training forward has none). It gives both of::

    init_cache(model, batch: int, max_len: int, dtype: torch.dtype, device: torch.device) -> cache
    decode_forward(model, tokens: LongTensor [B, T], positions: LongTensor [B, T],
                   cache) -> logits [B, T, vocab_size] in ``dtype``

* ``cache`` is the adapter's own object (any type); the worker only passes it back.
* ``positions`` are absolute: the cache holds exactly positions ``[0, p)`` of every row before
  a call whose positions are ``[p, p + T)``. ``decode_forward`` appends the T positions' keys
  and values to the cache and attends over the cached positions and, causally, the new ones
  (plus the sliding window where the config asks for one: a cached key older than the window
  is not seen). A prefill is one call over the prompt on an empty cache (``p == 0``); a decode
  step is a call with ``T == 1``. No ``cu_seqlens``: every row is one sequence.
* The logits are those of ``forward`` over the whole sequence, up to the order of
  floating-point operations (a cached step multiplies other shapes than a full forward, as
  upstream's own cached decode does): the decode gate holds the cached step logits to
  upstream's own KV-cached decode with the site's bars, as for a C++ family, and the
  logprob_parity gate holds their log-probs to the training forward's.
* Without them (both ``None``) the worker recomputes the whole sequence with ``forward`` at every
  step and holds those steps to upstream's teacher-forced continuation instead. Giving only one
  of them is refused when the entry is loaded.

Tensor parallelism
------------------
``parallelize(model, tp_mesh)`` (optional) shards the model over a 1-D
``torch.distributed.device_mesh.DeviceMesh`` and returns it (DTensor parameters, e.g. through
``torch.distributed.tensor.parallel.parallelize_module``); every rank then calls ``forward``
with the same inputs and gets the full logits as a plain tensor. The worker calls it on every
rank with that rank's fully loaded model, over torch.distributed's default group (gloo on the
CPU, NCCL on GPUs), and reads parameters and gradients back with ``full_tensor()``. Under data
parallelism with tp inside each replica (dp x tp) ``tp_mesh`` is the "tp" dimension of a
("dp", "tp") mesh over the world: each replica's tp group. The worker reduces the gradients
over "dp" itself (each DTensor parameter's local shard gradient) and steps the local shards,
so ``parallelize`` applies tensor parallelism only.

Data parallelism
----------------
``data_parallel(model, dp_mesh)`` (optional) applies the adapter's own data parallelism, as its
framework does after tensor parallelism (FSDP2 ``fully_shard`` per decoder layer and on the
root, torchtitan's apply_fsdp). ``dp_mesh`` is the "dp" dimension of the ("dp", "tp") mesh: the
ranks holding the same tp shard. The worker then leaves the reduction to the model: each rank's
loss is its sequences' token sum divided by the global token count, so the reduction must sum
(``set_gradient_divide_factor(1.0)``; FSDP2's default divides by the data-parallel size), in
fp32 (``MixedPrecisionPolicy(reduce_dtype=torch.float32)``). The worker reads each parameter's
local gradient shard, steps its local shard in place, and gathers both with
``DTensor.full_tensor()`` to compare them with the single-rank control. Without
``data_parallel`` the worker replicates the model and reduces the gradients itself.

Expert parallelism
------------------
``expert_parallel(model, ep_mesh, expert_dp_mesh)`` (optional) splits a MoE model's experts
over the EP group, as its framework does after tensor parallelism and before data parallelism
(torchtitan's ExpertParallel: the stacked expert weights Shard(0) over ``ep_mesh``, tokens
dispatched to the rank holding their expert all-to-all and combined back). ``ep_mesh`` is a 1-D
mesh named "ep" over this rank's EP group; ``expert_dp_mesh`` a 1-D mesh named "dp_mod_ep"
over the data-parallel ranks that hold the same experts (one rank when every data-parallel
rank holds experts of its own): their expert gradients must be summed over it, in fp32. The EP
groups are the worker's (the ep innermost ranks of dp_shard x cp, docs/protocols.md), handed
over as they are. The experts must become DTensors over ``ep_mesh`` (a hook that leaves no
parameter over it fails the gate). The worker applies it only with ``data_parallel``, which
must then leave the expert-parallel parameters to it (FSDP2's ``ignored_params``): the model
reduces every gradient itself. Each MoE block keeps the tokens it routed to each expert in a
buffer named ``tokens_per_expert`` [E] (torchtitan's MoE has it for load balancing),
accumulated every forward: the worker reads the experts from it before calling the hook (no
such buffer, or ep not dividing E: the gate is BLOCKED), zeroes it before a step and sums it
over the data-parallel ranks after. A block may also keep ``router_near_ties`` [] int64, the
tokens whose k-th and (k+1)-th router logits lie within 2 units in the last place of their
dtype (ties included): a bf16 layout may flip those routings by rounding, and the gate
accepts up to that many flips (none without the buffer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

import torch

CONTRACT_VERSION = 1

__all__ = [
    "CONTRACT_VERSION",
    "ModelSpec",
    "StateDictAdapter",
    "BaseStateDictAdapter",
    "CoverageError",
    "check_coverage",
    "assign_parameters",
    "COMMON_IGNORED",
    "ConfigReader",
    "Fields",
    "field_error",
    "KeyMap",
    "check_tied_alias",
]


@runtime_checkable
class StateDictAdapter(Protocol):
    """Maps checkpoint (Hugging Face) names to the model's own names and back.

    from_hf(hf_sd) -> sd
        hf_sd: {hf_key: Tensor} of every checkpoint key (all shards). Returns {model parameter
        name: Tensor}; tensors keep their dtype (the caller casts). Must consume every key
        (see the module docstring) and raise naming any key it cannot map.
    to_hf(sd) -> hf_sd
        The inverse: exactly the checkpoint's keys, bit-equal tensors.
    convert_single_to_hf(name, tensor) -> [(hf_key, tensor), ...]   (optional)
        One model parameter in checkpoint naming (a stacked expert tensor gives one entry
        per expert).
    """

    def from_hf(self, hf_state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...

    def to_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...


class BaseStateDictAdapter:
    """Convenience base: ``convert_single_to_hf`` via ``to_hf`` on a one-entry dict."""

    def from_hf(self, hf_state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def to_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def convert_single_to_hf(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        return list(self.to_hf({name: tensor}).items())


@dataclass(frozen=True)
class ModelSpec:
    """What a Python adapter module exposes as ``SPEC``.

    name: the family name a cell asks for (e.g. "llama").
    model_types: the Hugging Face ``model_type`` values served.
    args_from_hf_config(config: dict) -> args: config.json parsed as a dict; raises
        ValueError naming field and value on a bad or unsupported value.
    config_accounting(config: dict) -> {field: None | reason}: None = mapped, str = ignored
        with the reason; absent = unmapped (the config gate FAILs).
    build_model(args, dtype, device) -> nn.Module with the forward in the module docstring.
    state_dict_adapter(args) -> StateDictAdapter.
    parallelize(model, tp_mesh) -> model, or None when the adapter has no TP plan.
    data_parallel(model, dp_mesh) -> model, optional: the adapter's own data parallelism
        (FSDP2 fully_shard over the 1-D ``dp_mesh``), applied after parallelize when the cell
        has several data-parallel ranks; its gradient reduction must SUM (see "Data
        parallelism" in the module docstring).
    expert_parallel(model, ep_mesh, expert_dp_mesh) -> model, optional: the experts split
        over the EP group (see "Expert parallelism" in the module docstring); applied after
        parallelize and before data_parallel when the cell's mesh has ep > 1.
    grad_norm(model) -> float, optional: the global gradient norm the adapter's framework
        clips with, computed from this rank's shards after a backward (a collective; e.g.
        torchtitan's clip_grad_norm_ with max_norm=inf). Without it the worker computes
        torch.nn.utils.get_total_norm per device mesh and combines the meshes' norms.
    gate_facts(args) -> dict, optional: the sizes the gates read, under Hugging Face names
        (vocab_size, num_hidden_layers, num_key_value_heads, head_dim,
        max_position_embeddings, tie_word_embeddings, min_sliding_window: 0 for none). When
        absent the worker reads them from the args' attributes under those names or Archon's
        (n_layers, n_kv_heads, max_seq_len; sliding_window).
    init_cache(model, batch, max_len, dtype, device) -> cache, optional, with decode_forward:
        an empty KV cache the adapter owns (any object) for ``batch`` rows of up to
        ``max_len`` positions, in the model's dtype on its device.
    decode_forward(model, tokens, positions, cache) -> logits, optional, with init_cache:
        the KV-cached forward (see "KV-cache decode" in the module docstring).
    """

    name: str
    model_types: tuple[str, ...]
    args_from_hf_config: Callable[[dict], Any]
    config_accounting: Callable[[dict], dict[str, str | None]]
    build_model: Callable[[Any, torch.dtype, torch.device], torch.nn.Module]
    state_dict_adapter: Callable[[Any], StateDictAdapter]
    parallelize: Callable[[torch.nn.Module, Any], torch.nn.Module] | None = None
    data_parallel: Callable[[torch.nn.Module, Any], torch.nn.Module] | None = None
    expert_parallel: Callable[[torch.nn.Module, Any, Any], torch.nn.Module] | None = None
    grad_norm: Callable[[torch.nn.Module], Any] | None = None
    gate_facts: Callable[[Any], dict] | None = None
    init_cache: Callable[[torch.nn.Module, int, int, torch.dtype, torch.device], Any] | None = None
    decode_forward: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, Any],
                             torch.Tensor] | None = None
    contract_version: int = CONTRACT_VERSION


class CoverageError(ValueError):
    """from_hf's output does not cover the model's parameters exactly."""


def check_coverage(model: torch.nn.Module, sd: dict[str, torch.Tensor]) -> None:
    """The worker's load-coverage check: every parameter of ``model`` (duplicates removed, so a
    tied output weight counts once) has an entry in ``sd`` with an equal shape, and every entry
    of ``sd`` names a parameter. Raises CoverageError listing what differs."""
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(sd))
    extra = sorted(set(sd) - set(params))
    shapes = sorted(f"{k}: model {tuple(params[k].shape)} vs {tuple(sd[k].shape)}"
                    for k in set(params) & set(sd) if tuple(params[k].shape) != tuple(sd[k].shape))
    problems = []
    if missing:
        problems.append(f"parameters not assigned: {missing}")
    if extra:
        problems.append(f"entries naming no parameter: {extra}")
    if shapes:
        problems.append(f"shape mismatches: {shapes}")
    if problems:
        raise CoverageError("; ".join(problems))


@torch.no_grad()
def assign_parameters(model: torch.nn.Module, sd: dict[str, torch.Tensor]) -> torch.nn.Module:
    """check_coverage, then copy each tensor into its parameter (cast to the parameter's dtype
    and device). Returns the model."""
    check_coverage(model, sd)
    for name, p in model.named_parameters():
        p.copy_(sd[name].to(device=p.device, dtype=p.dtype))
    return model


# Helpers every adapter shares (no framework ships them); after the contract's own names.
from gatehouse_adapter.config import COMMON_IGNORED, ConfigReader, Fields, field_error  # noqa: E402
from gatehouse_adapter.names import KeyMap, check_tied_alias  # noqa: E402
