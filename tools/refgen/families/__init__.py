"""Checkpoint variants per model family, for make_checkpoint.py.

Each module in this package (one per family) defines ``VARIANTS``: a dict of variant name ->
``Variant``. Names are unique across families and start with the family name
("qwen3-tiny-tied"). A variant is a tiny config of that family's transformers classes; the
generator saves it with ``save_pretrained`` and records upstream logits and greedy ids.
"""

import copy
import importlib
import pkgutil
from dataclasses import dataclass


# The tiny decoder most families start from (their modules override what differs): 2 layers,
# hidden 64, 4 query heads over 2 KV heads (GQA), a 256-token vocabulary, and rope_theta 50000,
# deliberately not the 10000 default, so a theta fallback bug changes logits.
TINY_BASE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    rope_theta=50000.0,
    hidden_act="silu",
    bos_token_id=1,
    eos_token_id=2,
)


@dataclass
class Variant:
    family: str              # Gatehouse family name (models/<family>)
    config_class: type       # transformers config class, e.g. LlamaConfig
    model_class: type        # transformers *ForCausalLM class
    config: dict             # keyword arguments of config_class
    max_shard_size: str | None = None  # e.g. "100KB": several shards plus an index
    norm_offset_one: bool = False      # norms compute x * (1 + w) (Gemma): init w near 0
    prompt_lengths: list | None = None  # default: make_checkpoint.PROMPT_LENGTHS
    notes: str = ""
    # Weight seed (default make_checkpoint.SEED); set where the default seed gives a degenerate
    # greedy continuation, which make_checkpoint rejects.
    seed: int | None = None
    # Embedding init std (default: make_checkpoint's rule, 0.5 untied / TIED_EMBED_STD tied).
    embed_std: float | None = None
    # A published config.json in tools/refgen/hub_configs/: `config` then holds only the fields
    # scaled down (each must be in the file), and the rest of the file is kept as published.
    hub_config: str | None = None
    # With hub_config: True writes the file as the Hub ships it; False keeps save_pretrained's
    # rewrite of it (transformers' current field names and defaults).
    hub_form: bool = False

    def stamp(self):
        """What determines the files (for the .done stamp). A deep copy: transformers fills
        nested config dicts (rope_scaling) in place."""
        return copy.deepcopy({
            "family": self.family,
            "config_class": self.config_class.__name__,
            "model_class": self.model_class.__name__,
            "config": self.config,
            "max_shard_size": self.max_shard_size,
            "norm_offset_one": self.norm_offset_one,
            "prompt_lengths": self.prompt_lengths,
            "seed": self.seed,
            "embed_std": self.embed_std,
            "hub_config": self.hub_config,
            "hub_form": self.hub_form,
        })


def hub_pair(family, config_class, model_class, name, hub_config, scaled, **kw):
    """The two variants of one published config: "<name>-hub" (config.json as the Hub ships
    it) and "<name>-saved" (as save_pretrained rewrites it)."""
    return {f"{name}-{form}": Variant(family, config_class, model_class, dict(scaled),
                                      hub_config=hub_config, hub_form=form == "hub", **kw)
            for form in ("hub", "saved")}


def all_variants():
    """name -> Variant over every family module, in module then definition order."""
    out = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for name, variant in module.VARIANTS.items():
            if name in out:
                raise RuntimeError(f"variant {name} defined twice")
            out[name] = variant
    return out
