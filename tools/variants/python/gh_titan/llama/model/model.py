"""Llama as torchtitan writes it: the shared gh_titan decoder (gh_titan.common.layers)."""

from __future__ import annotations

import torch

from gh_titan.common.layers import Decoder, TitanArgs, build_decoder


def build_model(args: TitanArgs, dtype: torch.dtype, device) -> Decoder:
    if args.qk_norm is not False:
        raise ValueError("args were not parsed by gh_titan.llama")
    return build_decoder(args, dtype, device)
