"""Name mapping between checkpoint (Hugging Face) keys and the model's own, for the dense parts
every decoder of this package shares, plus the tied-embedding rules of contract v1."""

from __future__ import annotations

import re

import torch

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

_LAYER = re.compile(r"(?<=layers\.)(\d+)(?=\.)")


class KeyMap:
    """Bidirectional template map; layer indices are carried over."""

    def __init__(self, from_hf: dict[str, str]):
        self.from_hf_map = dict(from_hf)
        self.to_hf_map = {v: k for k, v in from_hf.items()}

    @staticmethod
    def _convert(key: str, table: dict[str, str]) -> str | None:
        if key in table:
            return table[key]
        m = _LAYER.search(key)
        if m is None:
            return None
        abstract = key[:m.start()] + "{}" + key[m.end():]
        target = table.get(abstract)
        return None if target is None else target.replace("{}", m.group(1), 1)

    def hf_to_model(self, key: str) -> str | None:
        return self._convert(key, self.from_hf_map)

    def model_to_hf(self, key: str) -> str | None:
        return self._convert(key, self.to_hf_map)


def layer_of(key: str) -> int | None:
    m = _LAYER.search(key)
    return None if m is None else int(m.group(1))


def tied_lm_head(hf_state_dict: dict[str, torch.Tensor]) -> None:
    """A tied checkpoint that nevertheless holds lm_head.weight: it must equal the embedding,
    else the checkpoint asks for two different tensors where the model has one (upstream would
    silently keep the embedding)."""
    lm, emb = hf_state_dict["lm_head.weight"], hf_state_dict.get("model.embed_tokens.weight")
    if emb is None or lm.shape != emb.shape or not torch.equal(lm, emb.to(lm.dtype)):
        raise ValueError("tie_word_embeddings is true but the checkpoint's lm_head.weight differs "
                         "from model.embed_tokens.weight")
