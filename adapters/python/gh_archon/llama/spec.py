"""SPEC for the llama adapter (Gatehouse Python adapter contract v1)."""

from gatehouse_adapter import ModelSpec
from gh_archon.common.kv_cache import decode_forward, init_cache
from gh_archon.common.parallel import fully_shard_decoder
from gh_archon.llama.infra.parallelize import parallelize_llama
from gh_archon.llama.model.args import MODEL_TYPES, LlamaModelArgs
from gh_archon.llama.model.model import build_model
from gh_archon.llama.model.state_dict_adapter import LlamaStateDictAdapter

SPEC = ModelSpec(
    name="llama",
    model_types=MODEL_TYPES,
    args_from_hf_config=LlamaModelArgs.from_hf_config,
    config_accounting=LlamaModelArgs.config_accounting,
    build_model=build_model,
    state_dict_adapter=LlamaStateDictAdapter,
    init_cache=init_cache,
    decode_forward=decode_forward,
    data_parallel=fully_shard_decoder,
    parallelize=parallelize_llama,
)

__all__ = ["SPEC"]
