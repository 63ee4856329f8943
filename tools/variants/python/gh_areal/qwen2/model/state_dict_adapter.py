"""Checkpoint <-> Archon names for Qwen2 (areal/experimental/models/archon/qwen2/model/
state_dict_adapter.py): a rename, q/k/v biases included; no weight permutation (the checkpoint's
q/k rows are in the rotate-half layout Archon's RoPE uses). As Archon's, it skips keys it does
not map and aliases lm_head.weight to the embedding when tied; the Gatehouse shim refuses a
skipped key and verifies the alias."""

from __future__ import annotations

from typing import Any

from gh_areal.base import BaseStateDictAdapter

QWEN2_FROM_HF: dict[str, str | None] = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.layers.{}.self_attn.q_proj.weight": "layers.{}.attention.wq.weight",
    "model.layers.{}.self_attn.k_proj.weight": "layers.{}.attention.wk.weight",
    "model.layers.{}.self_attn.v_proj.weight": "layers.{}.attention.wv.weight",
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attention.wo.weight",
    "model.layers.{}.self_attn.q_proj.bias": "layers.{}.attention.wq.bias",
    "model.layers.{}.self_attn.k_proj.bias": "layers.{}.attention.wk.bias",
    "model.layers.{}.self_attn.v_proj.bias": "layers.{}.attention.wv.bias",
    "model.layers.{}.self_attn.rotary_emb.inv_freq": None,
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.feed_forward.w1.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.feed_forward.w3.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.feed_forward.w2.weight",
    "model.layers.{}.input_layernorm.weight": "layers.{}.attention_norm.weight",
    "model.layers.{}.post_attention_layernorm.weight": "layers.{}.ffn_norm.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
}


class Qwen2StateDictAdapter(BaseStateDictAdapter):
    def __init__(self, model_config: Any, hf_assets_path: str | None = None):
        super().__init__(model_config, hf_assets_path)
        self.from_hf_map = dict(QWEN2_FROM_HF)
