"""Qwen3 as torchtitan writes it: the shared gh_titan decoder (gh_titan.common.layers) with
per-head q/k RMSNorm before RoPE (Qwen3's q_norm / k_norm)."""

from __future__ import annotations

import torch

from gh_titan.common.layers import Decoder, TitanArgs, build_decoder


def build_model(args: TitanArgs, dtype: torch.dtype, device) -> Decoder:
    if args.qk_norm is not True:
        raise ValueError("args were not parsed by gh_titan.qwen3")
    return build_decoder(args, dtype, device)
