"""Reading ``config.json`` for an adapter: typed access whose errors name the field and the value,
and the accounting the config gate reports (contract v1, "Config accounting").

Two ways to use it:

* :class:`ConfigReader` -- read a field with a type (``reader.positive_int("hidden_size")``); a
  field read is *mapped*, a field declared with :meth:`ConfigReader.ignore` is *ignored* with its
  reason, any other field is left out of :meth:`ConfigReader.accounting` (*unmapped*: the config
  gate FAILs on it). A bad value raises ``ValueError("config field 'F' = V: why")``.
* :class:`Fields` -- the same, declared: which fields a port computes, which values it computes
  of them, which fields it ignores and why. A framework shim (``gatehouse_adapter.frameworks``)
  runs it before handing the config to the framework's own reader, so the framework's code
  stays as its authors wrote it.

A field whose value is JSON null counts as absent (upstream's defaults apply), as transformers
and the C++ families' reader (models/decoder/config_reader.cc) treat it.

Pure Python: no torch, no transformers.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field as dc_field
from typing import Any, Callable, Iterable, Mapping

__all__ = ["COMMON_IGNORED", "ConfigReader", "Fields", "field_error", "is_number", "show"]

MISSING = object()

# Fields no decoder's forward pass reads (models/decoder/config_reader.cc kCommonIgnored).
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
    "unk_token_id": "tokenizer metadata; not used by the forward pass",
    "initializer_range": "only initialises fresh weights; every weight is loaded from the "
                         "checkpoint",
    "attention_dropout": "dropout probability; Gatehouse inference and training run without "
                         "dropout (upstream applies none in eval mode either)",
    "output_attentions": "transformers output-format flag; no effect on logits",
    "output_hidden_states": "transformers output-format flag; no effect on logits",
    "return_dict": "transformers output-format flag; no effect on logits",
    "_name_or_path": "where the config was loaded from; provenance only",
    "_model_name_or_path": "model name recorded by transformers' GGUF loader; provenance only",
    "auto_map": "class names for transformers' trust_remote_code loading; the family is chosen "
                "by model_type and its computation is the adapter's",
}


def show(value: Any) -> str:
    """The value as config.json spells it (JSON), else its repr."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def field_error(field: str, value: Any, what: str) -> ValueError:
    """The contract's refusal: ``config field 'F' = V: what``."""
    return ValueError(f"config field '{field}' = {show(value)}: {what}")


def is_number(v: Any) -> bool:
    """A finite int or float (not a bool)."""
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def _listing(values: Iterable[Any]) -> str:
    return ", ".join(show(v) for v in values)


class ConfigReader:
    """Typed access to a config.json dict that remembers which fields were read (mapped) and
    which were declared ignored (with their reason).

    ``accounting()`` gives ``{field: None | reason}`` for the fields present; a field both read
    and declared ignored is mapped, unless ``ignore`` came after the read (the later
    declaration wins)."""

    def __init__(self, config: Any):
        if not isinstance(config, dict):
            raise ValueError(f"config.json must be a JSON object, got {type(config).__name__}")
        self.config = config
        self.mapped: set[str] = set()
        self.ignored: dict[str, str] = {}

    # -- raw access -------------------------------------------------------------------------
    def raw(self, field: str) -> Any:
        """The value (None when absent or null); marks a present field mapped."""
        if field in self.config:
            self.mapped.add(field)
        return self.config.get(field)

    def has_key(self, field: str) -> bool:
        """Whether the key is written (even as null)."""
        return field in self.config

    def present(self, field: str) -> bool:
        """Whether the field holds a value other than null. Does not mark it mapped."""
        return self.config.get(field) is not None

    def mark_mapped(self, *fields: str) -> None:
        """Marks fields mapped without reading them (those present)."""
        self.mapped.update(f for f in fields if f in self.config)

    # -- typed access -----------------------------------------------------------------------
    def _value(self, field: str, default: Any) -> Any:
        v = self.raw(field)
        if v is None and default is MISSING:
            raise ValueError(f"config field '{field}' is required but missing")
        return v

    def int(self, field: str, default: Any = MISSING) -> Any:
        """An integer (integral floats such as 4096.0 are refused: upstream would compute
        with a float)."""
        v = self._value(field, default)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise field_error(field, v, "expected an integer")
        return v

    def positive_int(self, field: str, default: Any = MISSING) -> Any:
        v = self.int(field, default)
        if v is not None and v <= 0:
            raise field_error(field, v, "must be positive")
        return v

    def number(self, field: str, default: Any = MISSING) -> Any:
        """An int or a float, returned as stored (upstream computes with the JSON value's own
        Python type, which can change the ops: int * tensor vs float * tensor)."""
        v = self._value(field, default)
        if v is None:
            return default
        if not is_number(v):
            raise field_error(field, v, "expected a finite number")
        return v

    def bool(self, field: str, default: Any = MISSING) -> Any:
        v = self._value(field, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise field_error(field, v, "expected true or false")
        return v

    def string_in(self, field: str, default: Any, allowed: tuple[str, ...], what: str) -> Any:
        """A string among ``allowed`` (``what`` names the kind, e.g. "activation")."""
        v = self.raw(field)
        if v is None:
            return default
        if not isinstance(v, str):
            raise field_error(field, v, "expected a string")
        if v not in allowed:
            raise field_error(field, v, f"unsupported {what} (implemented: "
                              + ", ".join(f'"{a}"' for a in allowed) + ")")
        return v

    def must_be(self, field: str, default: Any, allowed: Any, why: str) -> Any:
        """A field computed at one value only (usually upstream's default): absent, null or
        ``allowed`` is accepted (mapped), anything else refused with ``why``."""
        v = self.raw(field)
        if v is None:
            return default
        if isinstance(v, bool) != isinstance(allowed, bool) or v != allowed:
            raise field_error(field, v, why)
        return v

    # -- ignoring ---------------------------------------------------------------------------
    def ignore(self, field: str, reason: str) -> None:
        """Declares a field that does not change the computation (reported when present)."""
        self.ignored[field] = reason
        self.mapped.discard(field)

    def ignore_common(self) -> None:
        for field, reason in COMMON_IGNORED.items():
            self.ignore(field, reason)

    def ignore_unread_flag(self, field: str, reason: str, refusal: str) -> None:
        """A boolean upstream never reads: false or absent states what upstream computes
        (ignored); true asks for something upstream silently skips, so it is refused."""
        v = self.config.get(field)
        if v is None or v is False:
            self.ignore(field, reason)
            return
        raise field_error(field, v, refusal)

    # -- the accounting ---------------------------------------------------------------------
    def accounting(self) -> dict[str, str | None]:
        """{field: None (mapped) | reason (ignored)} for the fields present; a field neither
        read nor ignored is left out (unmapped)."""
        out: dict[str, str | None] = {}
        for field in self.config:
            if field in self.mapped:
                out[field] = None
            elif field in self.ignored:
                out[field] = self.ignored[field]
        return out

    @classmethod
    def account(cls, config: Any, parse: Callable[["ConfigReader"], Any], *,
                declare: Callable[["ConfigReader"], None] | None = None,
                read_fields: Iterable[str] = ()) -> dict[str, str | None]:
        """``config_accounting`` for a parser written on a ConfigReader: the accounting of
        ``parse(reader)``; when it refuses the config (ValueError, which fails the config gate
        through args_from_hf_config) the fields it may read (``read_fields``) count as mapped
        and ``declare(reader)`` declares the ignored ones, so the gate reports both."""
        reader = cls(config if isinstance(config, dict) else {})
        try:
            parse(reader)
        except ValueError:
            reader = cls(config if isinstance(config, dict) else {})
            reader.ignore_common()
            if declare is not None:
                declare(reader)
            reader.mark_mapped(*read_fields)
        return reader.accounting()


# -- declared ---------------------------------------------------------------------------------

_ROPE_DICTS = ("rope_parameters", "rope_scaling")


@dataclass(frozen=True)
class Fields:
    """What a port computes of config.json, declared once: the config gate's accounting and the
    contract's refusals follow from it.

    Each listed field is mapped when present (absent or null: upstream's default applies, and
    the framework reads that default from the transformers config object):

    model_types  the ``model_type`` values served (another is refused);
    sizes        positive integers;
    numbers      positive finite numbers;
    flags        true / false;
    mapped       honoured as they are (the framework reads them; no check here);
    only         ``{field: (values computed, why another is refused)}``; ``"field[]"`` applies
                 to every element of a list (``"layer_types[]"``); absent or null is upstream's
                 default and passes;
    divides      ``(a, b)`` pairs: the value of a must divide the value of b (e.g.
                 ``("num_key_value_heads", "num_attention_heads")``), checked on config.json
                 and, through :meth:`check_object`, on the defaults the config class fills in;
    rope_types   when given, RoPE is read as transformers 5 standardises it (``rope_parameters``,
                 or ``rope_scaling`` in older configs, ``rope_theta`` at the top level): its
                 ``rope_type`` must be one of these, its other keys among ``rope_keys`` (and
                 ``rope_theta``), a top-level ``partial_rotary_factor`` must be 1 unless listed
                 in ``rope_keys``;
    ignored      ``{field: reason}``: present, it does not change the computation;
    unread_flags ``{field: (reason, refusal)}``: a boolean upstream never reads; false or absent
                 is ignored with the reason, true (asking for what upstream silently skips)
                 refused with the refusal;
    check        ``check(reader)``: rules of the port's own (conditional ignores, ranges),
                 written on the ConfigReader.
    """

    model_types: tuple[str, ...] = ()
    sizes: tuple[str, ...] = ()
    numbers: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    mapped: tuple[str, ...] = ()
    only: Mapping[str, tuple[tuple[Any, ...], str]] = dc_field(default_factory=dict)
    divides: tuple[tuple[str, str], ...] = ()
    rope_types: tuple[str, ...] | None = None
    rope_keys: tuple[str, ...] = ()
    ignored: Mapping[str, str] = dc_field(default_factory=dict)
    unread_flags: Mapping[str, tuple[str, str]] = dc_field(default_factory=dict)
    check: Callable[[ConfigReader], None] | None = None

    def read(self, config: Any) -> ConfigReader:
        """Reads and checks ``config`` (a config.json dict); raises ValueError naming the field
        and the value for a value the port does not compute. Returns the reader (its
        ``accounting()`` is the config gate's)."""
        reader = ConfigReader(config)
        reader.ignore_common()
        for name, reason in self.ignored.items():
            reader.ignore(name, reason)
        for name, (reason, refusal) in self.unread_flags.items():
            reader.ignore_unread_flag(name, reason, refusal)
        if self.model_types:
            mt = reader.raw("model_type")
            if mt is not None and mt not in self.model_types:
                raise field_error("model_type", mt, "this adapter serves "
                                  + _listing(self.model_types))
        else:
            reader.raw("model_type")
        for name in self.sizes:
            reader.positive_int(name, None)
        for name in self.numbers:
            v = reader.number(name, None)
            if v is not None and not v > 0:
                raise field_error(name, v, "must be positive")
        for name in self.flags:
            reader.bool(name, None)
        for name in self.mapped:
            reader.raw(name)
        for key, (values, why) in self.only.items():
            name, each = (key[:-2], True) if key.endswith("[]") else (key, False)
            v = reader.raw(name)
            if v is None:
                continue  # absent or null: upstream's default
            if each:
                if not isinstance(v, list):
                    raise field_error(name, v, "expected a list")
                for i, item in enumerate(v):
                    if not _among(item, values):
                        raise field_error(f"{name}[{i}]", item, why)
            elif not _among(v, values):
                raise field_error(name, v, why)
        self._check_divides(lambda name: reader.config.get(name), absent="")
        if self.rope_types is not None:
            self._read_rope(reader)
        if self.check is not None:
            self.check(reader)
        return reader

    def check_object(self, obj: Any) -> None:
        """The ``divides`` rules on a parsed config object (a transformers PretrainedConfig):
        they hold for the defaults its class fills in as well."""
        self._check_divides(lambda name: getattr(obj, name, None),
                            absent=" (with the config class's defaults)")

    def _check_divides(self, get: Callable[[str], Any], absent: str) -> None:
        for a, b in self.divides:
            va, vb = get(a), get(b)
            if isinstance(va, int) and isinstance(vb, int) and va > 0 and vb % va:
                raise field_error(a, va, f"does not divide {b} = {vb}{absent}")

    def accounting(self, config: Any) -> dict[str, str | None]:
        """The config gate's accounting; when ``read`` refuses the config, every declared field
        present counts as mapped and the ignored ones keep their reasons."""
        return ConfigReader.account(config, self.read, declare=self._declare,
                                    read_fields=self.declared())

    def _declare(self, reader: ConfigReader) -> None:
        for name, reason in self.ignored.items():
            reader.ignore(name, reason)
        for name, (reason, _) in self.unread_flags.items():
            if reader.config.get(name):
                reader.mark_mapped(name)   # the refused value: reported with the refusal
            else:
                reader.ignore(name, reason)

    def declared(self) -> tuple[str, ...]:
        """Every field this declaration maps when present."""
        names = ["model_type", *self.sizes, *self.numbers, *self.flags, *self.mapped,
                 *(k[:-2] if k.endswith("[]") else k for k in self.only)]
        if self.rope_types is not None:
            names += [*_ROPE_DICTS, "rope_theta", "partial_rotary_factor"]
        return tuple(dict.fromkeys(names))

    def _read_rope(self, reader: ConfigReader) -> None:
        params, scaling = reader.raw("rope_parameters"), reader.raw("rope_scaling")
        if params and scaling and params != scaling:
            raise ValueError(f"config fields 'rope_parameters' = {show(params)} and "
                             f"'rope_scaling' = {show(scaling)} disagree; transformers reads "
                             "only one of them")
        d, prefix = (scaling, "rope_scaling") if scaling else (params or {}, "rope_parameters")
        if not isinstance(d, dict):
            raise field_error(prefix, d, "expected an object")
        computed = "(computed: " + _listing(self.rope_types) + ")"
        for key, value in d.items():
            if key in ("rope_type", "type"):
                if value not in self.rope_types:
                    raise field_error(f"{prefix}.{key}", value,
                                      f"RoPE type not computed by this port {computed}")
            elif key != "rope_theta" and key not in self.rope_keys:
                raise field_error(f"{prefix}.{key}", value,
                                  "RoPE parameter not computed by this port")
        if "rope_type" not in d and "type" not in d and "default" not in self.rope_types:
            raise field_error(f"{prefix}.rope_type", None,
                              f"the default RoPE is not computed by this port {computed}")
        top = reader.number("rope_theta", None)
        theta = d.get("rope_theta", top)
        if theta is not None and (not is_number(theta) or not theta > 0):
            raise field_error(f"{prefix}.rope_theta" if "rope_theta" in d else "rope_theta",
                              theta, "must be a positive number")
        if "partial_rotary_factor" not in self.rope_keys:
            prf = reader.number("partial_rotary_factor", None)
            if prf is not None and prf != 1:
                raise field_error("partial_rotary_factor", prf,
                                  "partial rotary embeddings are not computed by this port "
                                  "(it rotates the whole head)")


def _among(v: Any, values: tuple[Any, ...]) -> bool:
    """v equals one of values, booleans only equal to booleans (True is not 1)."""
    return any(isinstance(v, bool) == isinstance(a, bool) and v == a for a in values)
