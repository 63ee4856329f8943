"""What both framework shims share: the transformers config object built from config.json, the
contract's forward put on a framework's model class, tied weights, the state-dict adapter's
coverage checks, and a framework ParallelDims for Gatehouse's one mesh dimension (tp)."""

from __future__ import annotations

import copy
import inspect
from types import SimpleNamespace
from typing import Any, Callable

import torch
from torch import nn

from gatehouse_adapter import BaseStateDictAdapter, field_error
from gatehouse_adapter.config import Fields

_STATE = "_gatehouse_shim"   # attribute the shims keep their per-args state under

TIED_HF_KEY = "lm_head.weight"   # the checkpoint key a tied model may omit (contract v1)


# -- config -----------------------------------------------------------------------------------

def hf_config_from_dict(config: dict) -> Any:
    """config.json as transformers' own config object (``AutoConfig.for_model``), with the
    class's defaults filled in and RoPE standardised as transformers 5 does. Raises ValueError
    naming the field for a model_type transformers does not know, and with transformers' own
    message for a config its class refuses."""
    from transformers import AutoConfig

    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise field_error("model_type", model_type, "a framework shim needs the model_type to "
                          "build transformers' config object")
    rest = {k: copy.deepcopy(v) for k, v in config.items() if k != "model_type"}
    try:
        return AutoConfig.for_model(model_type, **rest)
    except ValueError as e:
        if "Unrecognized model identifier" in str(e) or model_type in str(e):
            raise field_error("model_type", model_type,
                              f"transformers has no config class for it ({e})") from e
        raise ValueError(f"config.json: transformers' config class refuses it: {e}") from e
    except (TypeError, KeyError) as e:
        raise ValueError(f"config.json: transformers' config class refuses it: "
                         f"{type(e).__name__}: {e}") from e


def read_config(fields: Fields, config: dict) -> Any:
    """The shims' first step of args_from_hf_config: the port's declared fields (ValueError
    naming field and value), then transformers' config object, its defaults checked too."""
    if not isinstance(fields, Fields):
        raise TypeError(f"fields must be a gatehouse_adapter.Fields, got {type(fields).__name__}")
    fields.read(config)
    hf = hf_config_from_dict(config)
    fields.check_object(hf)
    return hf


def remember(args: Any, **state: Any) -> Any:
    """Keeps the shim's state (the transformers config, the tie flag's name, ...) on the
    framework's args object, outside its dataclass fields."""
    held = getattr(args, _STATE, None)
    if held is None:
        held = {}
        try:
            object.__setattr__(args, _STATE, held)
        except (AttributeError, TypeError) as e:
            raise TypeError(f"{type(args).__name__} takes no extra attribute (__slots__?): the "
                            "shim keeps the transformers config on the args") from e
    held.update(state)
    return args


def recalled(args: Any, key: str) -> Any:
    held = getattr(args, _STATE, None)
    if held is None or key not in held:
        raise TypeError(f"{type(args).__name__} was not made by this shim's args_from_hf_config")
    return held[key]


def check_tie_flag(args: Any, tie_flag: str, hf_config: Any) -> bool:
    """The framework's tie flag (Archon / torchtitan: ``enable_weight_tying``) must say what
    config.json's ``tie_word_embeddings`` says: a framework reading another name would build an
    untied model for a tied checkpoint (or the reverse)."""
    if not hasattr(args, tie_flag):
        raise TypeError(f"{type(args).__name__} has no tie flag {tie_flag!r} (give tie_flag=)")
    ours = bool(getattr(args, tie_flag))
    theirs = bool(getattr(hf_config, "tie_word_embeddings", False))
    if ours != theirs:
        raise field_error("tie_word_embeddings", theirs,
                          f"the framework's args have {tie_flag} = {ours}: it did not read the "
                          "tie flag")
    return ours


# -- the model --------------------------------------------------------------------------------

def _module_and_attr(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    owner, _, attr = path.rpartition(".")
    return (model.get_submodule(owner) if owner else model), attr


def tie_weights(model: nn.Module, pairs: tuple[tuple[str, str], ...]) -> None:
    """Each (alias, target) parameter path: the alias becomes the target's Parameter."""
    for alias, target in pairs:
        mod, attr = _module_and_attr(model, alias)
        setattr(mod, attr, model.get_parameter(target))


def untied(model: nn.Module, pairs: tuple[tuple[str, str], ...]) -> list[str]:
    """The (alias, target) pairs whose parameters are no longer one object."""
    return [f"{a} / {t}" for a, t in pairs if model.get_parameter(a) is not model.get_parameter(t)]


def is_tied(model: nn.Module, pairs: tuple[tuple[str, str], ...]) -> bool:
    """Whether every (alias, target) pair exists and is one Parameter."""
    try:
        return bool(pairs) and not untied(model, pairs)
    except AttributeError:
        return False


def aliases_of(model: nn.Module) -> dict[str, str]:
    """{alias parameter name: the name named_parameters() keeps} for shared Parameters."""
    first: dict[int, str] = {}
    out: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            out[name] = first[id(p)]
        else:
            first[id(p)] = name
    return out


def materialise(model: nn.Module, dtype: torch.dtype, device: torch.device,
                tie: tuple[tuple[str, str], ...]) -> nn.Module:
    """A model built on the meta device, cast to dtype, given uninitialised storage on device
    (the worker assigns the checkpoint's weights), tied again (``to_empty`` gives a shared
    Parameter two storages), its buffers computed there (Archon's ``init_buffers``, else
    torchtitan's ``init_weights(buffer_device=...)``)."""
    model = model.to(dtype).to_empty(device=device)
    tie_weights(model, tie)
    with torch.no_grad():
        if callable(getattr(model, "init_buffers", None)):
            model.init_buffers(buffer_device=device)
        elif callable(getattr(model, "init_weights", None)):
            model.init_weights(buffer_device=device)
    return model


def check_rows(tokens: torch.Tensor, positions: torch.Tensor,
               cu_seqlens: torch.Tensor | None) -> list[int] | None:
    """Validates a contract call; for a packed row returns cu_seqlens as a list."""
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be [B, T], got shape {tuple(tokens.shape)}")
    if positions.shape != tokens.shape:
        raise ValueError(f"positions shape {tuple(positions.shape)} != tokens shape "
                         f"{tuple(tokens.shape)}")
    if cu_seqlens is None:
        return None
    if tokens.shape[0] != 1:
        raise ValueError(f"with cu_seqlens the batch must be 1 row, got {tokens.shape[0]}")
    cu = [int(c) for c in cu_seqlens.reshape(-1).tolist()]
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != tokens.shape[1] or any(
            b <= a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens {cu} must rise strictly from 0 to T = {tokens.shape[1]}")
    return cu


_CONTRACT_CLASSES: dict[tuple[type, Callable], type] = {}


def give_contract_forward(model: nn.Module, forward: Callable) -> nn.Module:
    """Makes ``model`` answer the contract's forward: its class becomes a subclass (one per
    framework class) whose ``forward(tokens, positions, cu_seqlens=None, max_seqlen=None)`` is
    ``forward(framework_forward, tokens, positions, cu_seqlens, max_seqlen)``, with
    ``framework_forward`` the framework's own bound forward. Parameter names, hooks and
    ``isinstance`` stay the framework's."""
    base = type(model)
    cls = _CONTRACT_CLASSES.get((base, forward))
    if cls is None:
        def contract_forward(self, tokens, positions, cu_seqlens=None, max_seqlen=None):
            return forward(base.forward.__get__(self), tokens, positions, cu_seqlens,
                           max_seqlen)

        cls = type(f"Gatehouse{base.__name__}", (base,),
                   {"forward": contract_forward, "framework_forward": base.forward,
                    "__module__": base.__module__,
                    "__doc__": f"{base.__qualname__} with Gatehouse's forward (contract v1)."})
        _CONTRACT_CLASSES[(base, forward)] = cls
    model.__class__ = cls
    return model


def takes(fn: Callable, name: str) -> bool:
    """Whether fn takes a parameter called name (or **kwargs)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


# -- weights ----------------------------------------------------------------------------------

class ShimStateDictAdapter(BaseStateDictAdapter):
    """Contract v1 around a framework's state-dict adapter.

    Frameworks' adapters skip what they do not know (``from_hf_map`` entries mapped to None, a
    key without a template) and, for a tied model, answer the output projection's name beside
    the embedding's. Here:

    * ``from_hf`` gets a copy (frameworks add ``lm_head.weight`` to their input when tied);
    * an alias entry (a tied parameter's second name, e.g. ``output.weight``) is dropped after
      checking it is the embedding's tensor (a checkpoint whose ``lm_head.weight`` differs from
      the embedding is refused);
    * every checkpoint key must come back from the framework's ``to_hf`` of what ``from_hf``
      gave: a key that does not was dropped, and is refused by name (KeyError); a tied
      checkpoint's ``lm_head.weight`` counts as consumed when equal to the embedding;
    * ``to_hf`` gives exactly the checkpoint's keys: the tied alias back only when the
      checkpoint read had it.
    """

    def __init__(self, framework_adapter: Any, aliases: dict[str, str], tied: bool):
        for method in ("from_hf", "to_hf"):
            if not callable(getattr(framework_adapter, method, None)):
                raise TypeError(f"{type(framework_adapter).__name__} has no {method}")
        self.framework = framework_adapter
        self.aliases = dict(aliases)
        self.tied = tied
        self._tied_key_seen = False
        self._what = type(framework_adapter).__name__

    def _framework_to_hf(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = self.framework.to_hf({k: v for k, v in sd.items() if k not in self.aliases})
        if not isinstance(out, dict):
            raise TypeError(f"{self._what}.to_hf returned {type(out).__name__}, not a dict")
        return out

    def from_hf(self, hf_state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        source = dict(hf_state_dict)
        out = self.framework.from_hf(dict(source))
        if not isinstance(out, dict):
            raise TypeError(f"{self._what}.from_hf returned {type(out).__name__}, not a dict")
        out = dict(out)
        for alias, target in self.aliases.items():
            if alias not in out:
                continue
            a, t = out.pop(alias), out.get(target)
            if t is not None and a is not t and (a.shape != t.shape or not torch.equal(
                    a, t.to(a.dtype))):
                raise ValueError(f"{alias} is tied to {target} but the checkpoint gives them "
                                 f"different tensors (is {TIED_HF_KEY} the embedding?)")
        back = self._framework_to_hf(out)
        dropped = [k for k in source if k not in back]
        if self.tied and TIED_HF_KEY in dropped:
            embed = self._hf_key_of_tied_target(out)
            if embed is not None and embed in source:
                lm, emb = source[TIED_HF_KEY], source[embed]
                if lm.shape != emb.shape or not torch.equal(lm, emb.to(lm.dtype)):
                    raise ValueError(f"tie_word_embeddings is true but the checkpoint's "
                                     f"{TIED_HF_KEY} differs from {embed}")
                dropped.remove(TIED_HF_KEY)
                self._tied_key_seen = True
        if dropped:
            raise KeyError(f"checkpoint keys {self._what}.from_hf drops (contract v1 consumes "
                           f"every key; map them or refuse the checkpoint): {sorted(dropped)}")
        invented = sorted(k for k in back if k not in source
                          and not (self.tied and k == TIED_HF_KEY))
        if invented:
            raise ValueError(f"{self._what}.to_hf(from_hf(checkpoint)) gives keys the checkpoint "
                             f"lacks: {invented}")
        return out

    def _hf_key_of_tied_target(self, sd: dict[str, torch.Tensor]) -> str | None:
        targets = {t for t in self.aliases.values() if t in sd}
        for t in targets:
            keys = list(self._framework_to_hf({t: sd[t]}))
            if len(keys) == 1:
                return keys[0]
        return None

    def to_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(self._framework_to_hf(state_dict))
        if self.tied:
            out.pop(TIED_HF_KEY, None)
            if self._tied_key_seen:
                embed = self._hf_key_of_tied_target(state_dict)
                if embed is not None and embed in out:
                    out[TIED_HF_KEY] = out[embed]
        return out

    def convert_single_to_hf(self, name: str, tensor: torch.Tensor
                             ) -> list[tuple[str, torch.Tensor]]:
        if name in self.aliases:
            return []
        single = getattr(self.framework, "convert_single_to_hf", None)
        if callable(single):
            return list(single(name, tensor))
        return list(self._framework_to_hf({name: tensor}).items())


def meta_aliases(build: Callable[[], nn.Module], tie: tuple[tuple[str, str], ...],
                 tied: bool) -> dict[str, str]:
    """The alias names of a model built (on the meta device) and tied as the shim builds it."""
    with torch.device("meta"):
        model = build()
    if tied:
        tie_weights(model, tie)
    return aliases_of(model)


# -- parallelism ------------------------------------------------------------------------------

class TensorParallelDims:
    """A framework's ParallelDims (torchtitan's, AReaL Archon's ArchonParallelDims) for the one
    dimension Gatehouse's parallel gate hands an adapter: tensor parallelism over the rank's tp
    group, on the 1-D mesh the worker made (the whole group, or under dp x tp the "tp"
    dimension of a ("dp", "tp") mesh: the worker reduces over "dp" itself, so to the
    framework the world is the tp group). Every other dimension is 1 and disabled;
    ``get_mesh`` / ``get_group`` answer "tp" (and None for any other name, as Archon's do);
    ``world_mesh`` is the same ranks under the dimension name "tp"."""

    def __init__(self, tp_mesh: Any):
        self._tp_mesh = tp_mesh
        self._named = None
        self.tp = int(tp_mesh.size())
        self.dp_replicate = self.dp_shard = self.cp = self.pp = self.ep = self.etp = 1
        self.world_size = self.tp
        self.device_type = getattr(tp_mesh, "device_type", "cpu")

    tp_enabled = property(lambda self: self.tp > 1)
    dp_replicate_enabled = dp_shard_enabled = dp_enabled = dp_cp_enabled = property(
        lambda self: False)
    fsdp_enabled = cp_enabled = pp_enabled = ep_enabled = etp_enabled = property(
        lambda self: False)
    loss_parallel_enabled = property(lambda self: False)
    fsdp_gradient_divide_factor = property(lambda self: 1)
    non_data_parallel_size = property(lambda self: self.tp)
    context_and_model_parallel_size = property(lambda self: self.tp)
    seq_len_divisor = property(lambda self: self.tp * 2)

    def get_mesh(self, name: Any) -> Any:
        return self._tp_mesh if name in ("tp", ["tp"], ("tp",)) else None

    def get_group(self, name: Any) -> Any:
        mesh = self.get_mesh(name)
        return None if mesh is None else mesh.get_group()

    @property
    def world_mesh(self) -> Any:
        if getattr(self._tp_mesh, "mesh_dim_names", None) == ("tp",):
            return self._tp_mesh
        if self._named is None:
            from torch.distributed.device_mesh import DeviceMesh

            self._named = DeviceMesh.from_group(self._tp_mesh.get_group(), self.device_type,
                                                mesh_dim_names=("tp",))
        return self._named

    def __repr__(self) -> str:
        return f"TensorParallelDims(tp={self.tp}, device_type={self.device_type!r})"


def after_parallelize(model: nn.Module, result: Any, tie: tuple[tuple[str, str], ...],
                      tied: bool, what: str) -> nn.Module:
    """The model a framework's parallelize_fn returned (or modified in place), its tied weights
    still one Parameter."""
    out = model if result is None else result
    if not isinstance(out, nn.Module):
        raise TypeError(f"{what} returned {type(out).__name__}, not a torch.nn.Module")
    if tied:
        broken = untied(out, tie)
        if broken:
            raise ValueError(f"{what} left tied parameters as separate tensors: {broken} "
                             "(re-tie them after sharding, as Archon's parallelize_fn does)")
    return out


def namespace(**sections: Any) -> SimpleNamespace:
    """Nested dicts as attribute namespaces (a framework's job config, read by attribute)."""
    return SimpleNamespace(**{k: namespace(**v) if isinstance(v, dict) else v
                              for k, v in sections.items()})


def gate_facts_from(args: Any, tie_flag: str, names: dict[str, str] | None = None) -> dict:
    """The gates' facts from framework args (Archon / torchtitan attribute names, or ``names``
    {fact: attribute})."""
    names = dict(names or {})

    def get(fact: str, *candidates: str, default: Any = None) -> Any:
        for attr in ((names[fact],) if fact in names else candidates):
            if hasattr(args, attr):
                return getattr(args, attr)
        if default is not None:
            return default
        raise AttributeError(f"{type(args).__name__} has none of {list(candidates)} for "
                             f"{fact} (give facts={{{fact!r}: attribute}})")

    head_dim = get("head_dim", "head_dim", default=-1)
    if head_dim in (-1, None):
        head_dim = get("dim", "dim", "hidden_size") // get("n_heads", "n_heads")
    window = get("sliding_window", "sliding_window", default=0) or 0
    kv_heads = get("num_key_value_heads", "n_kv_heads", "num_key_value_heads", default=-1)
    if kv_heads in (-1, None):   # torchtitan: None means as many as the query heads
        kv_heads = get("n_heads", "n_heads", "num_attention_heads")
    return {"vocab_size": get("vocab_size", "vocab_size"),
            "num_hidden_layers": get("num_hidden_layers", "n_layers", "num_hidden_layers"),
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "max_position_embeddings": get("max_position_embeddings", "max_seq_len",
                                           "max_position_embeddings"),
            "tie_word_embeddings": bool(getattr(args, tie_flag, False)),
            "min_sliding_window": int(window)}


__all__ = ["TensorParallelDims", "ShimStateDictAdapter", "hf_config_from_dict"]
