"""torchtitan's TrainSpec (torchtitan/protocols/train_spec.py, before its 2026 config registry):
the model class, its args per flavor, the parallelize function and the Hugging Face state-dict
adapter; the trainer's builders (optimizers, data loader, tokenizer, loss, ...) are not ported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from torch import nn


@dataclass
class TrainSpec:
    model_cls: type[nn.Module]
    model_args: Mapping[str, Any]
    parallelize_fn: Callable[..., nn.Module]
    pipelining_fn: Callable | None = None
    state_dict_adapter: type | None = None
