"""transformers' own *ForCausalLM class run with scaled_dot_product_attention, behind Gatehouse's
forward (contract v1): a correct implementation by construction that differs from the bundle's
canonical eager run only in the attention kernel.

The model is a subclass of upstream's class whose only change is ``forward``: the contract's
``(tokens, positions, cu_seqlens, max_seqlen) -> logits`` calls upstream's forward with
``position_ids=positions`` (unpacked), or once per packed sequence (cu_seqlens) with the
sequences' logits concatenated. Parameter names are upstream's, i.e. the checkpoint's, so
from_hf / to_hf are the identity on names (tied embeddings: lm_head.weight is the embedding's
Parameter, listed once by named_parameters as model.embed_tokens.weight).

Config accounting maps every field of config.json (None): the config is parsed by upstream's
own config class and computed by upstream's own model class, so whatever upstream honours or
ignores, this adapter honours or ignores identically.
"""

from __future__ import annotations

import copy
from typing import Callable

import torch

from gatehouse_adapter import BaseStateDictAdapter, ModelSpec

ATTN_IMPLEMENTATION = "sdpa"


def _contract_forward(upstream, tokens: torch.Tensor, positions: torch.Tensor,
                      cu_seqlens: torch.Tensor | None, max_seqlen: int | None) -> torch.Tensor:
    """Contract v1 forward over upstream's bound forward (see the module docstring)."""
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be [B, T], got shape {tuple(tokens.shape)}")
    if positions.shape != tokens.shape:
        raise ValueError(f"positions shape {tuple(positions.shape)} != tokens shape "
                         f"{tuple(tokens.shape)}")
    if cu_seqlens is None:
        return upstream(input_ids=tokens, position_ids=positions, use_cache=False).logits
    if tokens.shape[0] != 1:
        raise ValueError(f"with cu_seqlens the batch must be 1 row, got {tokens.shape[0]}")
    cu = [int(c) for c in cu_seqlens.reshape(-1).tolist()]
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != tokens.shape[1] or any(
            b <= a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens {cu} must rise strictly from 0 to T = {tokens.shape[1]}")
    parts = [upstream(input_ids=tokens[:, a:b], position_ids=positions[:, a:b],
                      use_cache=False).logits for a, b in zip(cu[:-1], cu[1:])]
    return torch.cat(parts, dim=1)


_SUBCLASSES: dict[type, type] = {}


def contract_class(upstream_class: type) -> type:
    """The subclass of upstream_class with the contract's forward (one per class)."""
    cls = _SUBCLASSES.get(upstream_class)
    if cls is None:
        def forward(self, tokens: torch.Tensor, positions: torch.Tensor,
                    cu_seqlens: torch.Tensor | None = None,
                    max_seqlen: int | None = None) -> torch.Tensor:
            return _contract_forward(upstream_class.forward.__get__(self), tokens, positions,
                                     cu_seqlens, max_seqlen)

        cls = type(f"Gatehouse{upstream_class.__name__}", (upstream_class,),
                   {"forward": forward, "__module__": __name__,
                    "__doc__": f"transformers' {upstream_class.__name__} (attention "
                               f"{ATTN_IMPLEMENTATION}) with Gatehouse's forward."})
        _SUBCLASSES[upstream_class] = cls
    return cls


class UpstreamFamily:
    """What a SPEC needs for one upstream (config class, model class) pair."""

    def __init__(self, model_type: str, config_class: type, model_class: type,
                 sliding: Callable[[object], int] | None = None):
        self.model_type = model_type
        self.config_class = config_class
        self.model_class = model_class
        self.sliding = sliding

    # -- config ---------------------------------------------------------------------------
    def args_from_hf_config(self, config: dict):
        """upstream's config object, parsed by upstream's config class as from_pretrained
        does; its errors (and another model_type) as ValueError."""
        if not isinstance(config, dict):
            raise ValueError(f"config.json must be a JSON object, got {type(config).__name__}")
        model_type = config.get("model_type")
        if model_type not in (None, self.model_type):
            raise ValueError(f"config field 'model_type' = {model_type!r}: this adapter serves "
                             f"{self.model_type!r}")
        try:
            cfg = self.config_class.from_dict(copy.deepcopy(config))
        except Exception as e:  # noqa: BLE001 - any refusal of upstream's is a bad config
            raise ValueError(f"transformers' {self.config_class.__name__} refuses this "
                             f"config: {type(e).__name__}: {e}") from e
        self._check_computable(config, cfg)
        return cfg

    def _check_computable(self, config: dict, cfg) -> None:
        """What upstream's config class accepts but its model cannot compute, refused naming
        the field: an unknown RoPE type (the model raises KeyError at init), KV heads that do
        not divide the query heads (upstream's GQA repeats each KV head heads // kv times), and
        anything else the model's construction raises on."""
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        source = "rope_scaling" if config.get("rope_scaling") else "rope_parameters"
        rope = getattr(cfg, "rope_parameters", None) or {}
        rope_type = rope.get("rope_type", "default") if isinstance(rope, dict) else "default"
        if rope_type != "default" and rope_type not in ROPE_INIT_FUNCTIONS:
            raise ValueError(f"config field '{source}.rope_type' = {rope_type!r}: transformers "
                             f"implements no such RoPE type (known: default, "
                             f"{', '.join(sorted(ROPE_INIT_FUNCTIONS))})")
        heads = cfg.num_attention_heads
        kv = getattr(cfg, "num_key_value_heads", None) or heads
        if not isinstance(kv, int) or kv <= 0 or heads % kv:
            raise ValueError(f"config field 'num_key_value_heads' = {kv!r}: must divide "
                             f"num_attention_heads = {heads} (upstream repeats each KV head "
                             f"num_attention_heads // num_key_value_heads times)")
        try:
            self._instantiate(cfg, None)
        except Exception as e:  # noqa: BLE001 - upstream cannot build this config
            raise ValueError(f"transformers' {self.model_class.__name__} cannot be built from "
                             f"this config: {type(e).__name__}: {e}") from e

    @staticmethod
    def config_accounting(config: dict) -> dict[str, str | None]:
        """Every field mapped (None): upstream's own config and model classes read the config,
        so every field is honoured exactly as upstream honours it (or ignores it)."""
        if not isinstance(config, dict):
            return {}
        return {field: None for field in config}

    def gate_facts(self, cfg) -> dict:
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        return {"vocab_size": cfg.vocab_size, "num_hidden_layers": cfg.num_hidden_layers,
                "num_key_value_heads": kv, "head_dim": head_dim,
                "max_position_embeddings": cfg.max_position_embeddings,
                "tie_word_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
                "min_sliding_window": self.sliding(cfg) if self.sliding else 0}

    # -- model ----------------------------------------------------------------------------
    def _instantiate(self, cfg, dtype: torch.dtype | None):
        kwargs = {"attn_implementation": ATTN_IMPLEMENTATION}
        if dtype is not None:
            kwargs["dtype"] = dtype
        with torch.device("meta"):
            return contract_class(self.model_class)._from_config(copy.deepcopy(cfg), **kwargs)

    def build_model(self, cfg, dtype: torch.dtype, device) -> torch.nn.Module:
        """Upstream's model on the meta device, materialised uninitialised on the device (no
        random init; the worker assigns the checkpoint's weights), parameters in dtype. The
        non-persistent RoPE buffers are computed as upstream computes them at init (on the CPU,
        fp32) and moved there; tied weights are tied again after materialisation."""
        device = torch.device(device)
        model = self._instantiate(cfg, dtype)
        model = model.to_empty(device=device)
        for module in model.modules():
            if type(module).__name__.endswith("RotaryEmbedding"):
                fresh = type(module)(config=module.config)
                for name, buf in fresh.named_buffers(recurse=False):
                    module._buffers[name] = buf.to(device)
                for attr in ("attention_scaling", "max_seq_len_cached", "original_max_seq_len"):
                    if hasattr(fresh, attr):
                        setattr(module, attr, getattr(fresh, attr))
        model.tie_weights()
        leftover = [n for n, b in model.named_buffers() if b.device.type == "meta"]
        if leftover:
            raise RuntimeError(f"buffers left uninitialised: {leftover}")
        return model.eval()

    def parameter_names(self, cfg) -> set[str]:
        return {n for n, _ in self._instantiate(cfg, None).named_parameters()}

    def state_dict_adapter(self, cfg) -> "IdentityStateDictAdapter":
        return IdentityStateDictAdapter(self.parameter_names(cfg),
                                        bool(getattr(cfg, "tie_word_embeddings", False)))

    def spec(self, name: str) -> ModelSpec:
        return ModelSpec(name=name, model_types=(self.model_type,),
                         args_from_hf_config=self.args_from_hf_config,
                         config_accounting=self.config_accounting,
                         build_model=self.build_model,
                         state_dict_adapter=self.state_dict_adapter,
                         parallelize=None, gate_facts=self.gate_facts)


EMBED = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"


class IdentityStateDictAdapter(BaseStateDictAdapter):
    """Checkpoint names are the model's. Tied: a checkpoint's lm_head.weight is verified equal
    to the embedding and consumed, and written back by to_hf only when it was there."""

    def __init__(self, names: set[str], tied: bool):
        self.names = names
        self.tied = tied
        self._tied_lm_head_seen = False

    def from_hf(self, hf_state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out, unknown = {}, []
        for key, value in hf_state_dict.items():
            if self.tied and key == LM_HEAD:
                emb = hf_state_dict.get(EMBED)
                if emb is None or emb.shape != value.shape or not torch.equal(
                        value, emb.to(value.dtype)):
                    raise ValueError("tie_word_embeddings is true but the checkpoint's "
                                     "lm_head.weight differs from model.embed_tokens.weight")
                self._tied_lm_head_seen = True
                continue
            if key not in self.names:
                unknown.append(key)
                continue
            out[key] = value
        if unknown:
            raise KeyError(f"checkpoint keys naming no parameter of upstream's model: "
                           f"{sorted(unknown)}")
        return out

    def to_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for name, value in state_dict.items():
            if self.tied and name == LM_HEAD:
                continue  # the embedding (state_dict() lists the tied alias too)
            if name not in self.names:
                raise KeyError(f"{name!r} is no parameter of upstream's model")
            out[name] = value
        if self.tied and self._tied_lm_head_seen and EMBED in out:
            out[LM_HEAD] = out[EMBED]
        return out
