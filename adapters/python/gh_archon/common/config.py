"""Reading config.json dicts: typed field access with ValueErrors that name the field and value,
and the accounting (mapped / ignored-with-reason) the config gate reports.

A field whose value is JSON null counts as absent (upstream's defaults apply), as for the C++
families (models/decoder/config_reader.cc).
"""

from __future__ import annotations

import json
import math
from typing import Any

_MISSING = object()

# Fields no decoder forward pass reads (models/decoder/config_reader.cc kCommonIgnored).
COMMON_IGNORED: dict[str, str] = {
    "architectures": "transformers auto-class names; the family is chosen by model_type",
    "transformers_version": "provenance of the writer; no effect on computation",
    "dtype": "storage dtype of the saved weights; the cell's precision sets the compute dtype",
    "torch_dtype": "storage dtype of the saved weights (older spelling of dtype); the cell's "
                   "precision sets the compute dtype",
    "use_cache": "transformers generate() runtime flag; caching does not change results",
    "bos_token_id": "tokenizer/generation metadata; not used by the forward pass",
    "eos_token_id": "generation stop token; the decode gate runs exactly max_new_tokens greedy "
                    "steps",
    "initializer_range": "only initialises fresh weights; every weight is loaded from the "
                         "checkpoint",
    "attention_dropout": "dropout probability; Gatehouse inference and training run without "
                         "dropout (upstream applies none in eval mode either)",
    "output_attentions": "transformers output-format flag; no effect on logits",
    "output_hidden_states": "transformers output-format flag; no effect on logits",
    "return_dict": "transformers output-format flag; no effect on logits",
    "_name_or_path": "where the config was loaded from; provenance only",
    "_model_name_or_path": "model name recorded by transformers' GGUF loader; provenance only",
    "unk_token_id": "tokenizer metadata; not used by the forward pass",
    "auto_map": "class names for transformers' trust_remote_code loading; the family is chosen "
                "by model_type and its computation is the adapter's",
}


def _show(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def field_error(field: str, value: Any, what: str) -> ValueError:
    return ValueError(f"config field '{field}' = {_show(value)}: {what}")


class ConfigReader:
    """Typed access to a config.json dict; remembers which fields were read (mapped) and which
    were declared ignored (with a reason)."""

    def __init__(self, config: dict):
        if not isinstance(config, dict):
            raise ValueError(f"config.json must be a JSON object, got {type(config).__name__}")
        self.config = config
        self.mapped: set[str] = set()
        self.ignored: dict[str, str] = {}

    # -- raw access -------------------------------------------------------------------------
    def raw(self, field: str) -> Any:
        """The value (None when absent or null); marks the field mapped."""
        if field in self.config:
            self.mapped.add(field)
        return self.config.get(field)

    def present(self, field: str) -> bool:
        return self.config.get(field) is not None

    # -- typed access -----------------------------------------------------------------------
    def int(self, field: str, default: Any = _MISSING) -> Any:
        v = self.raw(field)
        if v is None:
            if default is _MISSING:
                raise ValueError(f"config field '{field}' is required but missing")
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            # Integral floats (e.g. 4096.0) are refused too: upstream would use them as floats.
            raise field_error(field, v, "expected an integer")
        return v

    def positive_int(self, field: str, default: Any = _MISSING) -> Any:
        v = self.int(field, default)
        if v is not None and v <= 0:
            raise field_error(field, v, "must be positive")
        return v

    def number(self, field: str, default: Any = _MISSING) -> Any:
        """An int or float, returned as stored (upstream computes with the JSON value's own
        Python type, which can change the ops: int * tensor vs float * tensor)."""
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

    def string_in(self, field: str, default: str, allowed: tuple[str, ...], what: str) -> str:
        v = self.raw(field)
        if v is None:
            return default
        if not isinstance(v, str):
            raise field_error(field, v, "expected a string")
        if v not in allowed:
            raise field_error(field, v, f"unsupported {what} (implemented: "
                              + ", ".join(f'"{a}"' for a in allowed) + ")")
        return v

    # -- ignoring ---------------------------------------------------------------------------
    def ignore(self, field: str, reason: str) -> None:
        """Declares a field that does not change the computation (only reported when present)."""
        self.ignored[field] = reason

    def ignore_common(self) -> None:
        for field, reason in COMMON_IGNORED.items():
            self.ignore(field, reason)

    def ignore_unread_flag(self, field: str, reason: str, refusal: str) -> None:
        """A boolean upstream never reads: false states what upstream computes (ignored); true
        asks for something upstream silently skips, so it is refused."""
        v = self.config.get(field)
        if v is None or v is False:
            self.ignore(field, reason)
            return
        raise field_error(field, v, refusal)

    # -- the accounting ---------------------------------------------------------------------
    def accounting(self) -> dict[str, str | None]:
        """{field: None (mapped) | reason (ignored)} for the fields present in the config; a
        field present and neither read nor ignored is left out (unmapped)."""
        out: dict[str, str | None] = {}
        for field in self.config:
            if field in self.mapped:
                out[field] = None
            elif field in self.ignored:
                out[field] = self.ignored[field]
        return out
