"""The checkpoint (Hugging Face) <-> model name table of the dense parts every decoder of this
package shares. The map and the tied-embedding rule are gatehouse_adapter.names' (one KeyMap for
every adapter), re-exported here."""

from __future__ import annotations

import torch

from gatehouse_adapter.names import KeyMap, check_tied_alias, layer_of  # noqa: F401

# HF key template -> model key template ({} = layer index).
DENSE_FROM_HF: dict[str, str] = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
    "model.layers.{}.input_layernorm.weight": "layers.{}.attention_norm.weight",
    "model.layers.{}.post_attention_layernorm.weight": "layers.{}.ffn_norm.weight",
    "model.layers.{}.self_attn.q_proj.weight": "layers.{}.attention.wq.weight",
    "model.layers.{}.self_attn.k_proj.weight": "layers.{}.attention.wk.weight",
    "model.layers.{}.self_attn.v_proj.weight": "layers.{}.attention.wv.weight",
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attention.wo.weight",
    "model.layers.{}.self_attn.q_proj.bias": "layers.{}.attention.wq.bias",
    "model.layers.{}.self_attn.k_proj.bias": "layers.{}.attention.wk.bias",
    "model.layers.{}.self_attn.v_proj.bias": "layers.{}.attention.wv.bias",
    "model.layers.{}.self_attn.o_proj.bias": "layers.{}.attention.wo.bias",
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.feed_forward.w1.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.feed_forward.w3.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.feed_forward.w2.weight",
    "model.layers.{}.mlp.gate_proj.bias": "layers.{}.feed_forward.w1.bias",
    "model.layers.{}.mlp.up_proj.bias": "layers.{}.feed_forward.w3.bias",
    "model.layers.{}.mlp.down_proj.bias": "layers.{}.feed_forward.w2.bias",
}


def tied_lm_head(hf_state_dict: dict[str, torch.Tensor]) -> None:
    """A tied checkpoint holding lm_head.weight: it must equal model.embed_tokens.weight."""
    check_tied_alias(hf_state_dict)
