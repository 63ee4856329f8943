"""config.json access for the gh_titan adapters: typed reads that raise ValueError naming the
field and the value, and the accounting the config gate reports (a field read is "mapped", a
field declared ignored carries its reason, anything else is unmapped).

A field whose value is JSON null counts as absent unless a caller asks otherwise (upstream's
defaults then apply).
"""

from __future__ import annotations

import json
import math
from typing import Any

_REQUIRED = object()

# Fields no decoder forward pass reads.
COMMON_IGNORED: dict[str, str] = {
    "architectures": "transformers auto-class names; the family is chosen by model_type",
    "transformers_version": "provenance of the writer; no effect on computation",
    "dtype": "storage dtype of the saved weights; the cell's precision sets the compute dtype",
    "torch_dtype": "storage dtype of the saved weights (older spelling of dtype); the cell's "
                   "precision sets the compute dtype",
    "use_cache": "transformers generate() runtime flag; a KV cache does not change results",
    "bos_token_id": "tokenizer/generation metadata; not read by the forward pass",
    "eos_token_id": "generation stop token; the decode gate runs a fixed number of greedy steps",
    "unk_token_id": "tokenizer metadata; not read by the forward pass",
    "initializer_range": "only initialises fresh weights; every weight comes from the checkpoint",
    "attention_dropout": "dropout probability; Gatehouse runs inference and training without "
                         "dropout (upstream applies none in eval mode either)",
    "output_attentions": "transformers output-format flag; no effect on logits",
    "output_hidden_states": "transformers output-format flag; no effect on logits",
    "return_dict": "transformers output-format flag; no effect on logits",
    "_name_or_path": "where the config was loaded from; provenance only",
    "_model_name_or_path": "model name recorded by transformers' GGUF loader; provenance only",
    "auto_map": "class names for trust_remote_code loading; the computation is the adapter's",
}


def show(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def field_error(field: str, value: Any, what: str) -> ValueError:
    return ValueError(f"config field '{field}' = {show(value)}: {what}")


def is_number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


class ConfigReader:
    """Typed access to a config.json dict that remembers what was read and what was ignored."""

    def __init__(self, config: Any):
        if not isinstance(config, dict):
            raise ValueError(f"config.json must be a JSON object, got {type(config).__name__}")
        self.config = config
        self.mapped: set[str] = set()
        self.ignored: dict[str, str] = {}

    def raw(self, field: str) -> Any:
        """The value (None when absent or null); marks a present field mapped."""
        if field in self.config:
            self.mapped.add(field)
        return self.config.get(field)

    def has_key(self, field: str) -> bool:
        return field in self.config

    def present(self, field: str) -> bool:
        return self.config.get(field) is not None

    def int(self, field: str, default: Any = _REQUIRED) -> Any:
        v = self.raw(field)
        if v is None:
            if default is _REQUIRED:
                raise ValueError(f"config field '{field}' is required but missing")
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise field_error(field, v, "expected an integer")
        return v

    def positive_int(self, field: str, default: Any = _REQUIRED) -> Any:
        v = self.int(field, default)
        if v is not None and v <= 0:
            raise field_error(field, v, "must be positive")
        return v

    def number(self, field: str, default: Any = _REQUIRED) -> Any:
        """An int or a float, as stored."""
        v = self.raw(field)
        if v is None:
            if default is _REQUIRED:
                raise ValueError(f"config field '{field}' is required but missing")
            return default
        if not is_number(v):
            raise field_error(field, v, "expected a finite number")
        return v

    def bool(self, field: str, default: bool) -> bool:
        v = self.raw(field)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise field_error(field, v, "expected true or false")
        return v

    def must_be(self, field: str, default: Any, allowed: Any, why: str) -> Any:
        """A field this adapter computes only at one value (the upstream default, usually):
        absent, null or `allowed` is accepted (mapped), anything else refused."""
        v = self.raw(field)
        if v is None:
            return default
        if isinstance(v, bool) != isinstance(allowed, bool) or v != allowed:
            raise field_error(field, v, why)
        return v

    def ignore(self, field: str, reason: str) -> None:
        self.ignored[field] = reason

    def ignore_common(self) -> None:
        for field, reason in COMMON_IGNORED.items():
            self.ignore(field, reason)

    def accounting(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for field in self.config:
            if field in self.mapped:
                out[field] = None
            elif field in self.ignored:
                out[field] = self.ignored[field]
        return out
