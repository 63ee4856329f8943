"""Archon's ModelSpec (areal/experimental/models/archon/model_spec.py): what a model family
registers with AReaL's engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn


@dataclass
class ModelSpec:
    name: str
    model_class: type[nn.Module]
    model_args_class: type
    state_dict_adapter_class: type
    parallelize_fn: Callable[..., nn.Module]
    supported_model_types: frozenset[str]
    pipelining_fn: Callable | None = None
