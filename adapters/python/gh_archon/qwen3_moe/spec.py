"""SPEC for the qwen3_moe adapter (Gatehouse Python adapter contract v1)."""

from gatehouse_adapter import ModelSpec
from gh_archon.common.kv_cache import decode_forward, init_cache
from gh_archon.common.parallel import fully_shard_decoder
from gh_archon.qwen3_moe.infra.parallelize import (expert_parallelize_qwen3_moe,
                                                   parallelize_qwen3_moe)
from gh_archon.qwen3_moe.model.args import MODEL_TYPES, Qwen3MoeModelArgs
from gh_archon.qwen3_moe.model.model import build_model
from gh_archon.qwen3_moe.model.state_dict_adapter import Qwen3MoeStateDictAdapter

SPEC = ModelSpec(
    name="qwen3_moe",
    model_types=MODEL_TYPES,
    args_from_hf_config=Qwen3MoeModelArgs.from_hf_config,
    config_accounting=Qwen3MoeModelArgs.config_accounting,
    build_model=build_model,
    state_dict_adapter=Qwen3MoeStateDictAdapter,
    init_cache=init_cache,
    decode_forward=decode_forward,
    data_parallel=fully_shard_decoder,
    parallelize=parallelize_qwen3_moe,
    expert_parallel=expert_parallelize_qwen3_moe,
)

__all__ = ["SPEC"]
