"""Reading config.json dicts for the gh_areal adapters: typed access whose ValueErrors name the
field and its value, and the accounting (mapped / ignored with a reason) the config gate reads.

A field whose value is JSON null counts as absent, as transformers treats it (its defaults
apply).
"""

from __future__ import annotations

import json
import math
from typing import Any

_MISSING = object()

# Fields no decoder forward pass reads.
COMMON_IGNORED: dict[str, str] = {
    "architectures": "transformers auto-class names; the family is chosen by model_type",
    "transformers_version": "provenance of the writer; no effect on computation",
    "dtype": "storage dtype of the saved weights; the cell's precision sets the compute dtype",
    "torch_dtype": "storage dtype of the saved weights (older spelling of dtype); the cell's "
                   "precision sets the compute dtype",
    "use_cache": "transformers generate() runtime flag; caching does not change results",
    "bos_token_id": "tokenizer/generation metadata; not used by the forward pass",
    "eos_token_id": "generation stop token (AReaL keeps it as eos_id and never computes with "
                    "it); the decode gate runs exactly max_new_tokens greedy steps",
    "initializer_range": "only initialises fresh weights; every weight is loaded from the "
                         "checkpoint",
    "attention_dropout": "dropout probability; AReaL's attention applies none, and Gatehouse "
                         "runs without dropout (upstream applies none in eval mode either)",
    "output_attentions": "transformers output-format flag; no effect on logits",
    "output_hidden_states": "transformers output-format flag; no effect on logits",
    "return_dict": "transformers output-format flag; no effect on logits",
    "_name_or_path": "where the config was loaded from; provenance only",
    "unk_token_id": "tokenizer metadata; not used by the forward pass",
}


def _show(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def field_error(field: str, value: Any, what: str) -> ValueError:
    return ValueError(f"config field '{field}' = {_show(value)}: {what}")


class ConfigReader:
    """Typed access to a config.json dict; remembers the fields read (mapped) and the fields
    declared ignored (with their reason)."""

    def __init__(self, config: dict):
        if not isinstance(config, dict):
            raise ValueError(f"config.json must be a JSON object, got {type(config).__name__}")
        self.config = config
        self.mapped: set[str] = set()
        self.ignored: dict[str, str] = {}

    def raw(self, field: str) -> Any:
        """The value (None when absent or null); marks the field mapped."""
        if field in self.config:
            self.mapped.add(field)
        return self.config.get(field)

    def present(self, field: str) -> bool:
        return self.config.get(field) is not None

    def int(self, field: str, default: Any = _MISSING) -> Any:
        v = self.raw(field)
        if v is None:
            if default is _MISSING:
                raise ValueError(f"config field '{field}' is required but missing")
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise field_error(field, v, "expected an integer")
        return v

    def positive_int(self, field: str, default: Any = _MISSING) -> Any:
        v = self.int(field, default)
        if v is not None and v <= 0:
            raise field_error(field, v, "must be positive")
        return v

    def number(self, field: str, default: Any = _MISSING) -> Any:
        """An int or float, returned with the JSON value's own Python type."""
        v = self.raw(field)
        if v is None:
            if default is _MISSING:
                raise ValueError(f"config field '{field}' is required but missing")
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise field_error(field, v, "expected a finite number")
        return v

    def bool(self, field: str, default: bool) -> bool:
        v = self.raw(field)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise field_error(field, v, "expected true or false")
        return v

    def ignore(self, field: str, reason: str) -> None:
        """Declares a field that does not change the computation (reported when present)."""
        self.ignored[field] = reason
        self.mapped.discard(field)

    def ignore_common(self) -> None:
        for field, reason in COMMON_IGNORED.items():
            self.ignore(field, reason)

    def accounting(self) -> dict[str, str | None]:
        """{field: None (mapped) | reason (ignored)} for the fields of the config; a field
        neither read nor ignored is left out (unmapped: the config gate FAILs on it)."""
        out: dict[str, str | None] = {}
        for field in self.config:
            if field in self.ignored:
                out[field] = self.ignored[field]
            elif field in self.mapped:
                out[field] = None
        return out
