"""The worker's side of the Python lane: what the embedded interpreter runs for the C++ gates.

The Gatehouse worker (``worker_lib/python_lane``) embeds CPython through the torch wheel's own
``libtorch_python``, so a tensor here is the very ``at::Tensor`` the gates hold: nothing is
copied between the two sides. Every function below takes and returns plain values (``str``,
``int``, ``dict``, lists of ``(name, Tensor)`` pairs) and raises an exception whose message the
worker puts in the evidence; the gates, their order and their bars stay in C++.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from typing import Any

import torch

from gatehouse_adapter import CONTRACT_VERSION, ModelSpec

__all__ = [
    "load_spec", "parse_config", "gate_facts", "args_json", "build_model", "state_dict_adapter",
    "named_parameters", "forward", "from_hf", "to_hf",
]

# The facts the gates read from any family's args (gatehouse::worker::ModelArgs), each with the
# attribute names it is looked up under on an adapter's args: the Hugging Face name first, then
# the Archon / torchtitan one. An adapter whose args use other names gives ModelSpec.gate_facts.
_FACT_ATTRIBUTES = {
    "vocab_size": ("vocab_size",),
    "num_hidden_layers": ("num_hidden_layers", "n_layers"),
    "num_key_value_heads": ("num_key_value_heads", "n_kv_heads"),
    "head_dim": ("head_dim",),
    "max_position_embeddings": ("max_position_embeddings", "max_seq_len"),
    "tie_word_embeddings": ("tie_word_embeddings",),
}


def load_spec(entry: str) -> ModelSpec:
    """Imports ``entry`` ("package.module:ATTRIBUTE") and returns the ModelSpec it names.
    Raises ImportError / AttributeError / TypeError / ValueError naming the entry."""
    module_name, sep, attribute = entry.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"entry {entry!r}: expected 'package.module:ATTRIBUTE'")
    module = importlib.import_module(module_name)
    spec = getattr(module, attribute, None)
    if spec is None:
        raise AttributeError(f"entry {entry!r}: module {module_name} has no {attribute}")
    for field in ("name", "model_types", "args_from_hf_config", "config_accounting",
                  "build_model", "state_dict_adapter"):
        if not hasattr(spec, field):
            raise TypeError(f"entry {entry!r}: {type(spec).__name__} has no {field!r} "
                            "(expected a gatehouse_adapter.ModelSpec)")
    version = getattr(spec, "contract_version", CONTRACT_VERSION)
    if version != CONTRACT_VERSION:
        raise ValueError(f"entry {entry!r}: contract_version {version}, this worker runs "
                         f"contract {CONTRACT_VERSION}")
    if not isinstance(spec.name, str) or not spec.name:
        raise TypeError(f"entry {entry!r}: name must be a non-empty string, got {spec.name!r}")
    if isinstance(spec.model_types, str) or not all(isinstance(t, str) for t in spec.model_types):
        raise TypeError(f"entry {entry!r}: model_types must be a sequence of strings, "
                        f"got {spec.model_types!r}")
    return spec


def parse_config(spec: ModelSpec, config_text: str) -> tuple[Any, dict, str | None]:
    """config.json's text -> (args or None, accounting {field: None | reason}, error or None).
    The accounting is asked for even when parsing fails, so the config gate can report both."""
    config = json.loads(config_text)
    accounting = spec.config_accounting(config)
    if not isinstance(accounting, dict) or not all(
            isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in accounting.items()):
        raise TypeError("config_accounting must return {field: None | reason string}, got "
                        f"{accounting!r:.200}")
    try:
        args = spec.args_from_hf_config(config)
    except ValueError as e:
        return None, accounting, str(e)
    return args, accounting, None


def gate_facts(spec: ModelSpec, args: Any) -> dict:
    """The ModelArgs accessors the gates read (sizes, tie_word_embeddings and the smallest
    sliding window, 0 for none), from ``spec.gate_facts(args)`` when the spec has one, else
    from the args' attributes (_FACT_ATTRIBUTES). Raises AttributeError naming a missing fact."""
    custom = getattr(spec, "gate_facts", None)
    if custom is not None:
        facts = dict(custom(args))
    else:
        facts = {}
        for fact, names in _FACT_ATTRIBUTES.items():
            for name in names:
                if hasattr(args, name):
                    facts[fact] = getattr(args, name)
                    break
            else:
                raise AttributeError(
                    f"args {type(args).__name__} has none of {list(names)} for {fact}; give "
                    "ModelSpec.gate_facts")
        window = getattr(args, "sliding_window", None)
        facts["min_sliding_window"] = int(window) if window else 0
    missing = [f for f in (*_FACT_ATTRIBUTES, "min_sliding_window") if f not in facts]
    if missing:
        raise AttributeError(f"gate_facts lacks {missing}")
    out = {f: int(facts[f]) for f in _FACT_ATTRIBUTES if f != "tie_word_embeddings"}
    out["tie_word_embeddings"] = bool(facts["tie_word_embeddings"])
    out["min_sliding_window"] = int(facts["min_sliding_window"] or 0)
    return out


def args_json(args: Any) -> str:
    """The args as JSON text for the evidence (dataclasses as dicts; other values as str)."""
    value = dataclasses.asdict(args) if dataclasses.is_dataclass(args) else vars(args)
    return json.dumps(value, default=str, sort_keys=True)


def build_model(spec: ModelSpec, args: Any, dtype: str, device: str) -> torch.nn.Module:
    """spec.build_model with torch's dtype named by ``dtype`` ("float32", "bfloat16") on
    ``device`` ("cpu", "cuda:0"); the module comes back in eval mode."""
    model = spec.build_model(args, getattr(torch, dtype), torch.device(device))
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"build_model returned {type(model).__name__}, not a torch.nn.Module")
    return model.eval()


def state_dict_adapter(spec: ModelSpec, args: Any):
    """One adapter instance per args (it may remember what from_hf read, e.g. a tied alias)."""
    adapter = spec.state_dict_adapter(args)
    for method in ("from_hf", "to_hf"):
        if not callable(getattr(adapter, method, None)):
            raise TypeError(f"state_dict_adapter returned {type(adapter).__name__} without {method}")
    return adapter


def named_parameters(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every parameter under every name it has (a tied weight under both), in registration
    order: the C++ side groups them by identity as for its own modules."""
    return list(model.named_parameters(remove_duplicate=False))


def forward(model: torch.nn.Module, tokens: torch.Tensor, positions: torch.Tensor,
            cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """The Archon forward; for a packed row, max_seqlen is computed from cu_seqlens."""
    if cu_seqlens is None:
        return model(tokens, positions)
    max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max().item()) if cu_seqlens.numel() > 1 else 0
    return model(tokens, positions, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)


def _checked(result: Any, what: str) -> list[tuple[str, torch.Tensor]]:
    if not isinstance(result, dict):
        raise TypeError(f"{what} returned {type(result).__name__}, not a dict")
    bad = [k for k, v in result.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise TypeError(f"{what} returned entries that are not str -> Tensor: {bad[:5]}")
    return list(result.items())


def from_hf(adapter, items: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """adapter.from_hf over the checkpoint's tensors, as (parameter name, tensor) pairs."""
    return _checked(adapter.from_hf(dict(items)), "from_hf")


def to_hf(adapter, items: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """adapter.to_hf over (parameter name, tensor) pairs, as (checkpoint key, tensor) pairs."""
    return _checked(adapter.to_hf(dict(items)), "to_hf")
