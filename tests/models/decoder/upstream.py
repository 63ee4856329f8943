"""Upstream (transformers) answers for the decoder's per-source tests (tests/models/decoder).

    upstream.py COMMAND IN.json OUT.json

IN holds {"cases": [...]}; OUT gets {"results": [...]}, one per case, in order. Tensors travel
as {"shape": [...], "values": [...]} of fp32 numbers (bf16 values are exact in fp32; Python's
float repr round-trips every fp32 value exactly).

Commands:
  rope     case {"model_type", "config", "positions" [B, T] ints, "x" [B, H, T, head_dim]}:
           the family's RotaryEmbedding on that config (rope_parameters or the legacy
           rope_scaling, dynamic_rope_update included) -> {"inv_freq", "cos", "sin", "rotated"},
           rotated = apply_rotary_pos_emb(x, x, cos, sin)[0], all fp32.
  rmsnorm  case {"model_type" ("llama" | "gemma"), "dtype", "eps", "x", "weight"}:
           LlamaRMSNorm / GemmaRMSNorm forward in that dtype -> {"y"}.
  keys     case {"model_type", "config"}: the tensor names save_pretrained writes for
           AutoModelForCausalLM.from_config(config) -> {"keys": [...]}, sorted.
"""

import json
import os
import sys
import tempfile

# MKL results independent of memory alignment, as the worker runs it (docs/bars.md).
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import torch
import transformers
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def tensor(obj, dtype=torch.float32):
    return torch.tensor(obj["values"], dtype=torch.float32).reshape(obj["shape"]).to(dtype)


def plain(t):
    t = t.detach().to(torch.float32).contiguous()
    return {"shape": list(t.shape), "values": t.reshape(-1).tolist()}


def modeling(model_type):
    return __import__(f"transformers.models.{model_type}.modeling_{model_type}",
                      fromlist=["_"])


def rope(case):
    config = AutoConfig.for_model(case["model_type"], **case["config"])
    module = modeling(case["model_type"])
    rotary_cls = next(getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding"))
    rotary = rotary_cls(config)
    x = tensor(case["x"])
    positions = torch.tensor(case["positions"], dtype=torch.int64)
    with torch.no_grad():
        cos, sin = rotary(x, positions)
        rotated, _ = module.apply_rotary_pos_emb(x, x, cos, sin)
    return {"inv_freq": plain(rotary.inv_freq), "cos": plain(cos), "sin": plain(sin),
            "rotated": plain(rotated)}


def rmsnorm(case):
    dtype = DTYPES[case["dtype"]]
    x = tensor(case["x"], dtype)
    weight = tensor(case["weight"])
    if case["model_type"] == "gemma":
        norm = modeling("gemma").GemmaRMSNorm(weight.numel(), eps=case["eps"])
    else:
        norm = modeling("llama").LlamaRMSNorm(weight.numel(), eps=case["eps"])
    with torch.no_grad():
        norm.weight.copy_(weight)
        norm.to(dtype)
        return {"y": plain(norm(x))}


def keys(case):
    config = AutoConfig.for_model(case["model_type"], **case["config"])
    model = AutoModelForCausalLM.from_config(config)
    with tempfile.TemporaryDirectory() as out:
        model.save_pretrained(out)
        names = []
        for file in sorted(os.listdir(out)):
            if file.endswith(".safetensors"):
                with safe_open(os.path.join(out, file), framework="pt") as f:
                    names.extend(f.keys())
    return {"keys": sorted(names)}


def main():
    command, src, dst = sys.argv[1:4]
    handler = {"rope": rope, "rmsnorm": rmsnorm, "keys": keys}[command]
    with open(src) as f:
        cases = json.load(f)["cases"]
    results = [handler(case) for case in cases]
    with open(dst, "w") as f:
        json.dump({"transformers": transformers.__version__, "results": results}, f)


if __name__ == "__main__":
    main()
