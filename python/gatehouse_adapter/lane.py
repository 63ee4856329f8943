"""The worker's side of the Python lane: what the embedded interpreter runs for the C++ gates.

The Gatehouse worker (``worker_lib/python_lane``) embeds CPython through the torch wheel's own
``libtorch_python``, so a tensor here is the very ``at::Tensor`` the gates hold: nothing is
copied between the two sides. Every function below takes and returns plain values (``str``,
``int``, ``dict``, lists of ``(name, Tensor)`` pairs) and raises an exception whose message the
worker puts in the evidence; the gates, their order and their bars stay in C++.
"""

from __future__ import annotations

import dataclasses
import fcntl
import importlib
import json
import os
import socket
import struct
from datetime import timedelta
from typing import Any

import torch

from gatehouse_adapter import CONTRACT_VERSION, ModelSpec

__all__ = [
    "load_spec", "parse_config", "gate_facts", "args_json", "build_model", "state_dict_adapter",
    "forward", "caches_keys_and_values", "init_cache", "decode_forward", "from_hf", "to_hf",
    "zero_grad", "join_group",
    "parallelize", "reduces_data_parallel", "expert_token_counts", "expert_near_ties",
    "reset_expert_token_counts",
    "local_gradients", "clipping_grad_norm", "local_parameters",
    "full_tensors", "full_of_local",
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
    given = {f: getattr(spec, f, None) for f in ("init_cache", "decode_forward")}
    if (given["init_cache"] is None) != (given["decode_forward"] is None):
        missing = next(f for f, v in given.items() if v is None)
        raise TypeError(f"entry {entry!r}: the KV-cache decode needs both init_cache and "
                        f"decode_forward; {missing} is None")
    for f, v in given.items():
        if v is not None and not callable(v):
            raise TypeError(f"entry {entry!r}: {f} must be callable, got {type(v).__name__}")
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


def forward(model: torch.nn.Module, tokens: torch.Tensor, positions: torch.Tensor,
            cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """The Archon forward; for a packed row, max_seqlen is computed from cu_seqlens."""
    if cu_seqlens is None:
        return model(tokens, positions)
    max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max().item()) if cu_seqlens.numel() > 1 else 0
    return model(tokens, positions, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)


def caches_keys_and_values(spec: ModelSpec) -> bool:
    """True when the spec gives the optional KV-cache decode (init_cache and decode_forward;
    load_spec refused one without the other)."""
    return getattr(spec, "decode_forward", None) is not None


def init_cache(spec: ModelSpec, model: torch.nn.Module, batch: int, max_len: int) -> Any:
    """spec.init_cache for ``batch`` rows of up to ``max_len`` positions, in the dtype and on
    the device of the model's first parameter."""
    p = next(model.parameters())
    cache = spec.init_cache(model, batch, max_len, p.dtype, p.device)
    if cache is None:
        raise TypeError("init_cache returned None, not a cache")
    return cache


def decode_forward(spec: ModelSpec, model: torch.nn.Module, tokens: torch.Tensor,
                   positions: torch.Tensor, cache: Any) -> torch.Tensor:
    """spec.decode_forward: tokens, positions [B, T] int64 (absolute, after the cached ones) ->
    logits [B, T, vocab_size]. Raises TypeError when the result is not a tensor of [B, T, ...]."""
    logits = spec.decode_forward(model, tokens, positions, cache)
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"decode_forward returned {type(logits).__name__}, not a Tensor")
    if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(tokens.shape):
        raise TypeError(f"decode_forward returned logits {list(logits.shape)} for tokens "
                        f"{list(tokens.shape)}; expected [B, T, vocab_size]")
    return logits


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


def zero_grad(model: torch.nn.Module) -> None:
    """Drops every parameter's gradient (set to None), DTensor parameters included."""
    model.zero_grad(set_to_none=True)


# -- tensor parallelism ------------------------------------------------------------------------

# Keys of this interpreter's group in the worker's rendezvous store, apart from the C++ group's.
_STORE_PREFIX = "gatehouse/python_lane/"


def _interface_of(address: str) -> str | None:
    """The name of the network interface holding IPv4 ``address`` (Linux SIOCGIFADDR), or None."""
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode()))
            except OSError:  # no IPv4 address on this interface
                continue
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None


def join_group(rank: int, world_size: int, device: str, timeout_s: int) -> None:
    """Makes torch.distributed's default group for this rank, once per process: gloo for a CPU
    ``device``, NCCL for a CUDA one ("cuda:1": this rank's device). The ranks meet in the worker's
    rendezvous store (rank 0's TCPStore at MASTER_ADDR:MASTER_PORT, which the worker's own
    group already uses), under a prefix of their own; gloo's transport binds to the interface
    holding MASTER_ADDR, as the worker's group does, waiting ``timeout_s`` seconds as it does.
    Raises RuntimeError naming what is wrong."""
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError("this torch has no torch.distributed")
    if dist.is_initialized():
        if dist.get_rank() != rank or dist.get_world_size() != world_size:
            raise RuntimeError(f"torch.distributed is already initialised as rank "
                               f"{dist.get_rank()} of {dist.get_world_size()}, not {rank} of "
                               f"{world_size}")
        return
    device = torch.device(device)
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        raise RuntimeError("MASTER_ADDR and MASTER_PORT must be set for tensor parallelism "
                           "(the agent sets them for every rank)")
    timeout = timedelta(seconds=timeout_s)
    store = dist.PrefixStore(_STORE_PREFIX, dist.TCPStore(addr, int(port), is_master=False,
                                                          timeout=timeout))
    if device.type == "cuda":
        dist.init_process_group("nccl", store=store, rank=rank, world_size=world_size,
                                timeout=timeout, device_id=device)
        return
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        interface = _interface_of(addr)
        if interface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=timeout)


def parallelize(spec: ModelSpec, model: torch.nn.Module, tp_size: int | None = None,
                expert_groups: list[list[int]] | None = None,
                expert_replica_groups: list[list[int]] | None = None) -> torch.nn.Module:
    """Shards ``model`` as the adapter does, over the group join_group made: with ``tp_size``
    None or the world's size, ``spec.parallelize(model, tp_mesh)`` over every rank; else over a
    ("dp", "tp") mesh (tp fastest, as the worker lays ranks out: the tp groups are runs of
    ``tp_size`` consecutive ranks, the data-parallel dimensions flattened into "dp"):
    ``spec.parallelize(model, mesh["tp"])`` when tp > 1; then, with ``expert_groups`` (given
    when ep > 1: every EP group of the world, the worker's, each a list of ranks: a partition) and
    ``expert_replica_groups`` (every group of data-parallel ranks holding the same experts, a
    partition), ``spec.expert_parallel(model, ep_mesh, expert_dp_mesh)`` over this rank's two
    groups; then, when the spec gives ``data_parallel``, ``spec.data_parallel(model,
    mesh["dp"])`` (the adapter's own FSDP2). Every mesh dimension is named. A collective: every
    rank calls it with its own loaded full model. Raises TypeError when tp > 1 and the spec has
    no parallelize, ep > 1 and no expert_parallel or no data_parallel, or a hook returns
    something other than a Module; ValueError when ``tp_size`` does not divide the world or the
    groups do not hold this rank; the adapter's own exception (e.g. a TP size that does not
    divide the heads) propagates."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    device = next(model.parameters()).device
    world = dist.get_world_size()
    tp = world if tp_size is None else int(tp_size)
    data_parallel = getattr(spec, "data_parallel", None)
    try:
        if tp < 1 or world % tp:
            raise ValueError(f"tp size {tp} does not divide the world size {world}")
        if tp > 1 and spec.parallelize is None:
            raise TypeError(f"{spec.name}: the ModelSpec gives no parallelize")
        if tp == world:
            mesh = None
            tp_mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("tp",))
        else:
            mesh = init_device_mesh(device.type, (world // tp, tp), mesh_dim_names=("dp", "tp"))
            tp_mesh = mesh["tp"]
        sharded = model
        if tp > 1:
            sharded = _hook("parallelize", spec.parallelize, model, tp_mesh)
        if expert_groups:
            if getattr(spec, "expert_parallel", None) is None:
                raise TypeError(f"{spec.name}: the ModelSpec gives no expert_parallel")
            if data_parallel is None:
                raise TypeError(f"{spec.name}: expert_parallel needs data_parallel (the model "
                                "reduces its own gradients under expert parallelism)")
            ep_mesh = _mesh_of_own_group(device.type, expert_groups, "ep")
            expert_dp_mesh = _mesh_of_own_group(device.type, expert_replica_groups or [], "dp_mod_ep")
            sharded = _hook("expert_parallel", spec.expert_parallel, sharded, ep_mesh,
                            expert_dp_mesh)
            if not _has_parameters_over(sharded, "ep"):
                raise ValueError("expert_parallel split no parameter over the ep mesh (the "
                                 "experts must become DTensors sharded over it)")
        if mesh is not None and data_parallel is not None:
            sharded = _hook("data_parallel", data_parallel, sharded, mesh["dp"])
            sharded._gatehouse_reduces_data_parallel = True
    except BaseException:
        # The other ranks may be waiting in one of parallelize's collectives: closing this
        # rank's group ends their wait now ("connection closed by peer") instead of at the
        # group timeout. The worker's own group is unaffected and carries the reasons.
        dist.destroy_process_group()
        raise
    return sharded.eval()


def _hook(name: str, fn, *args) -> torch.nn.Module:
    """``fn(*args)``, a SPEC hook, checked to return a Module; an exception it raises comes
    back as the same type with the hook's name in front of its message."""
    try:
        result = fn(*args)
    except Exception as e:
        # Raised without binding it here: a local holding it would tie this frame to its
        # traceback in a cycle, keeping the hook's meshes and their process groups open until
        # the garbage collector runs, so the other ranks would wait in their collectives.
        raise _named(name, e) from e
    return _checked_module(result, name)


def _named(name: str, e: Exception) -> Exception:
    """``e``'s type with ``name`` in front of its message (a RuntimeError when that type
    cannot be made from a message)."""
    try:
        return type(e)(f"{name}: {e}")
    except Exception:
        return RuntimeError(f"{name}: {type(e).__name__}: {e}")


def _has_parameters_over(model: torch.nn.Module, dim_name: str) -> bool:
    """True when some parameter is a DTensor over a mesh with a dimension ``dim_name``."""
    return any(_is_dtensor(p) and dim_name in (p.device_mesh.mesh_dim_names or ())
               for p in model.parameters())


def _mesh_of_own_group(device_type: str, groups: list[list[int]], name: str):
    """A 1-D DeviceMesh named ``name`` over the group of ``groups`` (a partition of the world)
    that holds this rank. Every rank creates every group's process group, in order (a
    collective over the world)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    rank = dist.get_rank()
    own = None
    for ranks in groups:
        group = dist.new_group([int(r) for r in ranks])
        if rank in ranks:
            own = group
    if own is None:
        raise ValueError(f"no {name} group holds rank {rank}: {groups}")
    return DeviceMesh.from_group(own, device_type, mesh_dim_names=(name,))


def _buffers_named(model: torch.nn.Module, name: str) -> list[torch.Tensor]:
    """Every buffer called ``name`` (the last part of its qualified name), in module order."""
    return [b for n, b in model.named_buffers() if n.rsplit(".", 1)[-1] == name]


@torch.no_grad()
def expert_token_counts(model: torch.nn.Module) -> torch.Tensor | None:
    """The tokens this rank routed to each expert, one row per MoE block (modules with a
    ``tokens_per_expert`` buffer, in module order): [moe_layers, E] int64 on the CPU, or None
    for a model without one."""
    rows = _buffers_named(model, "tokens_per_expert")
    if not rows:
        return None
    return torch.stack([r.detach().to("cpu", torch.float64) for r in rows]).round().to(torch.int64)


@torch.no_grad()
def expert_near_ties(model: torch.nn.Module) -> int:
    """The tokens routed at a near tie (the MoE blocks' ``router_near_ties`` buffers, summed);
    0 for a model whose blocks keep none."""
    return int(sum(int(b.item()) for b in _buffers_named(model, "router_near_ties")))


@torch.no_grad()
def reset_expert_token_counts(model: torch.nn.Module) -> None:
    """Zeroes every ``tokens_per_expert`` and ``router_near_ties`` buffer."""
    for b in _buffers_named(model, "tokens_per_expert") + _buffers_named(model, "router_near_ties"):
        b.zero_()


def _checked_module(result: Any, what: str) -> torch.nn.Module:
    if not isinstance(result, torch.nn.Module):
        raise TypeError(f"{what} returned {type(result).__name__}, not a torch.nn.Module")
    return result


def reduces_data_parallel(model: torch.nn.Module) -> bool:
    """True when parallelize applied the adapter's own data parallelism (``data_parallel``): its
    gradients after a backward are already reduced over the data-parallel ranks."""
    return bool(getattr(model, "_gatehouse_reduces_data_parallel", False))


@torch.no_grad()
def local_gradients(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Each parameter's gradient (duplicates removed, named_parameters order) as this rank holds
    it, zeros where it has none: a DTensor gradient's local tensor, after making it the
    parameter's own layout (a replicated weight met by sharded activations, Qwen3's q_norm /
    k_norm under SequenceParallel, gets a Partial gradient: all-reduced over its mesh, as an
    optimizer stepping the DTensor would see it; a collective in the same order on every rank).
    The result shares storage with the gradient, which the worker reduces in place."""
    out = []
    for name, p in model.named_parameters():
        grad = p.grad
        if grad is None:
            local = p.to_local() if _is_dtensor(p) else p
            out.append((name, torch.zeros_like(local)))
            continue
        if _is_dtensor(grad):
            if tuple(grad.placements) != tuple(p.placements):
                grad = grad.redistribute(p.device_mesh, p.placements)
                p.grad = grad
            grad = grad.to_local()
        out.append((name, grad))
    return out


@torch.no_grad()
def clipping_grad_norm(spec: ModelSpec, model: torch.nn.Module) -> float:
    """The global L2 norm of the model's gradients as its trainer computes it to clip, from
    this rank's shards: ``spec.grad_norm(model)`` when the spec gives one (the adapter's
    framework's own clipping code), else torch.nn.utils.get_total_norm (what clip_grad_norm_
    calls) per device mesh, since DTensors of different meshes (FSDP2's "dp" x "tp", the
    experts' "ep") cannot be stacked, the meshes' norms then combined, as torchtitan's
    clip_grad_norm_ does for its expert and other parameters. A collective: every rank calls
    it together. Raises TypeError when grad_norm returns no number."""
    custom = getattr(spec, "grad_norm", None)
    if custom is not None:
        norm = custom(model)
        if _is_dtensor(norm):
            norm = norm.full_tensor()
        try:
            return float(norm)
        except (TypeError, ValueError) as e:
            raise TypeError(f"grad_norm returned {type(norm).__name__}, not a number") from e
    groups: dict[Any, list[torch.Tensor]] = {}
    for p in model.parameters():
        if p.grad is not None:
            groups.setdefault(p.grad.device_mesh if _is_dtensor(p.grad) else None, []).append(p.grad)
    total = 0.0
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, 2.0)
        if _is_dtensor(norm):
            norm = norm.full_tensor()
        total += float(norm.double()) ** 2
    return total ** 0.5


def _is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


@torch.no_grad()
def local_parameters(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every parameter under every name it has (a tied weight under both), in registration
    order: the C++ side registers them under these names and groups them by identity. A
    DTensor parameter (after parallelize) is given as this rank's local shard, what this rank
    holds; a plain parameter is the parameter itself, so the gates act on its storage."""
    return [(n, p.to_local() if _is_dtensor(p) else p)
            for n, p in model.named_parameters(remove_duplicate=False)]


@torch.no_grad()
def full_tensors(model: torch.nn.Module, gradients: bool) -> list[tuple[str, torch.Tensor]]:
    """Every parameter (duplicates removed) in full, or its gradient in full (zeros where it has
    none), detached. A DTensor is gathered with full_tensor(): a collective, so every rank calls
    this in the same order."""
    out = []
    for name, p in model.named_parameters():
        t = p.grad if gradients else p
        if t is None:
            t = torch.zeros(p.shape, dtype=p.dtype, device=p.device)
        elif _is_dtensor(t):
            t = t.full_tensor()
        out.append((name, t.detach()))
    return out


@torch.no_grad()
def full_of_local(model: torch.nn.Module,
                  items: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """Each (parameter name, local tensor shaped as this rank's shard of that parameter) put
    together as the model shards the parameter: for a DTensor parameter DTensor.from_local
    with its mesh and placements, then full_tensor() (a collective: every rank of the mesh
    calls this with the same names in the same order); a plain parameter's tensor as it is.
    Raises ValueError naming a parameter the model lacks or a tensor not shaped as its shard."""
    from torch.distributed.tensor import DTensor

    params = dict(model.named_parameters(remove_duplicate=False))
    out = []
    for name, t in items:
        p = params.get(name)
        if p is None:
            raise ValueError(f"full_of_local: the model has no parameter {name!r}")
        local = p.to_local() if _is_dtensor(p) else p
        if tuple(t.shape) != tuple(local.shape):
            raise ValueError(f"full_of_local: {name} is {list(t.shape)} here, its shard "
                             f"{list(local.shape)}")
        if _is_dtensor(p):
            t = DTensor.from_local(t, p.device_mesh, p.placements, run_check=False,
                                   shape=p.shape, stride=p.stride()).full_tensor()
        out.append((name, t.detach()))
    return out
