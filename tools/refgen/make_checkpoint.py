#!/usr/bin/env python3
"""Make tiny, real Hugging Face Llama checkpoints and a reference bundle beside each.

What
    For each variant NAME this writes
      OUT_ROOT/NAME/checkpoint/   config.json, generation_config.json and safetensors weights,
                                  all written by transformers' own ``save_pretrained``;
      OUT_ROOT/NAME/reference/    reference.safetensors + reference.json: upstream logits and
                                  greedy tokens for a few fixed probe prompts;
      OUT_ROOT/NAME/.done         a stamp of the generator parameters (see "Idempotent").

    Variants:
      llama-tiny-tied     tie_word_embeddings=true  (no lm_head.weight in the file)
      llama-tiny-untied   tie_word_embeddings=false
      llama-tiny-sharded  untied, saved with a small max_shard_size: >= 2 shards plus
                          model.safetensors.index.json

Why
    The Gatehouse gates (docs/protocols.md, ../shared/DESIGN.md) compare an adaptation against
    upstream. The fixtures must therefore come from upstream code, not from our own writer: the
    checkpoint layout, config.json fields and tied-weight handling are whatever this
    transformers version really does. The model is tiny (2 layers, hidden 64) so each variant
    takes a few seconds on 2 CPU cores, but its weights are chosen so that adapter bugs show:
      * rope_theta is 50000, not the 10000 default, so a theta fallback bug changes logits;
      * norm weights are drawn from U(0.5, 1.5), not left at 1.0, so a skipped norm shows;
      * weights have O(1) activations (std 1/sqrt(fan_in)), so logits are far from uniform and
        KL divergence is a sensitive measure;
      * one probe prompt is 300 tokens long, because RoPE bugs barely show at short positions.

Reference bundle (reference/reference.safetensors), for each probe prompt i:
      prompts.{i}.input_ids   I64 [T]
      prompts.{i}.logits      F32 [T, vocab_size]   one full forward pass, eager attention
      prompts.{i}.greedy_ids  I64 [32]              new tokens only, generate(do_sample=False)
      prompts.{i}.logits_bf16 F32 [T, vocab_size]   the same forward of the checkpoint loaded
                                                    with from_pretrained(dtype=bfloat16): the
                                                    bf16 cells' reference
      prompts.{i}.greedy_ids_bf16 I64 [32]          the same greedy with that bf16 model: the
                                                    bf16 cells' decode reference
    reference/reference.json:
      {"format": "gatehouse-reference/1", "num_prompts": N, "dtype": "float32",
       "max_new_tokens": 32, "transformers": ver, "torch": ver, "model_type": "llama",
       "seed": S, "device": "cpu"}

Idempotent
    A variant is skipped when OUT_ROOT/NAME/.done holds exactly this generator's parameters
    (variant settings, seed, prompt lengths, script format version, transformers and torch
    versions). Otherwise it is rebuilt in a temporary folder and moved into place, so an
    interrupted run never leaves a half-written variant behind a valid stamp.

CLI
    python tools/refgen/make_checkpoint.py --out-root DIR [--only NAME ...]
"""

import argparse
import copy
import json
import shutil
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file

# Bump when the output of this script changes for the same parameters.
GENERATOR_VERSION = 7
SEED = 20240611
MAX_NEW_TOKENS = 32
# Probe prompt lengths; the last one probes RoPE at long positions.
PROMPT_LENGTHS = [7, 33, 300]

# Variants come from one module per family in tools/refgen/families/ (a dict VARIANTS of
# name -> families.Variant); adding a family adds a module there.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from families import all_variants  # noqa: E402

VARIANTS = all_variants()


def generator_params(name):
    """Everything that determines a variant's files; stored in the .done stamp."""
    return {
        "generator_version": GENERATOR_VERSION,
        "name": name,
        "variant": VARIANTS[name].stamp(),
        "seed": SEED,
        "prompt_lengths": PROMPT_LENGTHS,
        "max_new_tokens": MAX_NEW_TOKENS,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }


def build_model(variant):
    """A fp32 *ForCausalLM of the variant's family with seeded weights chosen so that adapter
    bugs show."""
    torch.manual_seed(SEED)
    # Eager attention: the reference semantics (softmax in fp32 over explicit scores).
    config = variant.config_class(**variant.config, attn_implementation="eager")
    model = variant.model_class(config).to(torch.float32)
    assert model.config._attn_implementation == "eager"
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                # Away from the identity: a missing norm must change logits. Norms computing
                # x * (1 + w) (Gemma) get w around 0, the others w around 1.
                param.uniform_(-0.5, 0.5) if variant.norm_offset_one else param.uniform_(0.5, 1.5)
            elif param.dim() == 2 and "embed_tokens" in name:
                param.normal_(0.0, 0.5)
            elif param.dim() == 2:
                param.normal_(0.0, param.shape[1] ** -0.5)  # unit-scale activations
            else:
                param.normal_(0.0, 0.1)  # biases, when a config enables them
    model.eval()
    return model


def probe_prompts(vocab_size, lengths):
    """Prompt token ids from a fixed-seed generator, one tensor [T] per prompt."""
    gen = torch.Generator().manual_seed(SEED + 1)
    # Ids 0..2 are left out so no prompt contains the pad/bos/eos ids of the config.
    return [torch.randint(3, vocab_size, (n,), generator=gen, dtype=torch.int64) for n in lengths]


@torch.no_grad()
def make_reference(model, checkpoint_dir, out_dir, prompts, describe=None, meta_extra=None):
    """Writes reference.safetensors and reference.json for `model` (saved in checkpoint_dir)
    into out_dir.

    prompts: token id tensors [T] (int64). describe(i, new_ids) -> dict, when given, is stored
    as reference.json "prompts"[i] (e.g. the prompt text and upstream's decoded continuation,
    which the decode gate shows). meta_extra: more reference.json fields."""
    tensors = {}
    described = []
    # The bf16 reference: the checkpoint loaded as upstream loads it in bf16 (weights in bf16,
    # RoPE inv_freq buffers kept in fp32; a plain .to(bfloat16) would round those too), computed
    # in bf16. A bf16 cell is compared with this: bf16 rounding alone moves the top-1 of
    # near-tied logits.
    model_bf16 = type(model).from_pretrained(str(checkpoint_dir), dtype=torch.bfloat16,
                                             attn_implementation="eager").eval()
    for i, ids in enumerate(prompts):
        batch = ids.unsqueeze(0)
        mask = torch.ones_like(batch)
        logits = model(input_ids=batch, attention_mask=mask).logits[0].to(torch.float32)
        # Plain greedy, as the decode gate computes it: argmax at every step for exactly
        # MAX_NEW_TOKENS tokens. No eos stop and no eos suppression (min_new_tokens would mask
        # eos when it is the true argmax, and a fixture would then disagree with plain greedy).
        gen_config = copy.deepcopy(model.generation_config)
        gen_config.update(do_sample=False, max_new_tokens=MAX_NEW_TOKENS, eos_token_id=[],
                          pad_token_id=0)
        out = model.generate(input_ids=batch, attention_mask=mask, generation_config=gen_config)
        new_ids = out[0, ids.numel():]
        if new_ids.numel() != MAX_NEW_TOKENS:
            raise RuntimeError(f"prompt {i}: generate made {new_ids.numel()} tokens, not {MAX_NEW_TOKENS}")
        tensors[f"prompts.{i}.input_ids"] = ids.contiguous()
        tensors[f"prompts.{i}.logits"] = logits.contiguous()
        tensors[f"prompts.{i}.logits_bf16"] = (
            model_bf16(input_ids=batch, attention_mask=mask).logits[0].to(torch.float32).contiguous())
        tensors[f"prompts.{i}.greedy_ids"] = new_ids.to(torch.int64).contiguous()
        # The bf16 decode reference: the same plain greedy with the bf16 model.
        out_bf16 = model_bf16.generate(input_ids=batch, attention_mask=mask,
                                       generation_config=gen_config)
        tensors[f"prompts.{i}.greedy_ids_bf16"] = out_bf16[0, ids.numel():].to(torch.int64).contiguous()
        if describe is not None:
            described.append(describe(i, new_ids))
    out_dir.mkdir(parents=True)
    save_file(tensors, str(out_dir / "reference.safetensors"))
    meta = {
        "format": "gatehouse-reference/1",
        "num_prompts": len(prompts),
        "dtype": "float32",
        "max_new_tokens": MAX_NEW_TOKENS,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model_type": model.config.model_type,
        "seed": SEED,
        # Where the forwards ran: bf16 near-ties move with the kernels, and the inference gate
        # reads a bf16 bundle from another device kind with its cross-device top-1 bar.
        "device": next(model.parameters()).device.type,
    }
    if describe is not None:
        meta["prompts"] = described
    meta.update(meta_extra or {})
    (out_dir / "reference.json").write_text(json.dumps(meta, indent=2) + "\n")


def make_variant(out_root, name):
    """Builds OUT_ROOT/name unless its .done stamp already matches. Returns True if built."""
    params = generator_params(name)
    final = out_root / name
    stamp = final / ".done"
    if stamp.is_file():
        try:
            if json.loads(stamp.read_text()) == params:
                print(f"{name}: up to date", file=sys.stderr)
                return False
        except json.JSONDecodeError:
            pass  # a damaged stamp means rebuild

    tmp = out_root / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    variant = VARIANTS[name]
    model = build_model(variant)
    save_kwargs = {}
    if variant.max_shard_size is not None:
        save_kwargs["max_shard_size"] = variant.max_shard_size
    model.save_pretrained(str(tmp / "checkpoint"), **save_kwargs)
    if variant.max_shard_size is not None:
        shards = sorted((tmp / "checkpoint").glob("model-*.safetensors"))
        if len(shards) < 2 or not (tmp / "checkpoint" / "model.safetensors.index.json").is_file():
            raise RuntimeError(f"{name}: expected >= 2 shards and an index, got {[s.name for s in shards]}")
    prompts = probe_prompts(model.config.vocab_size, variant.prompt_lengths or PROMPT_LENGTHS)
    make_reference(model, tmp / "checkpoint", tmp / "reference", prompts)
    (tmp / ".done").write_text(json.dumps(params, indent=2, sort_keys=True) + "\n")

    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    print(f"{name}: written to {final}", file=sys.stderr)
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-root", required=True, type=Path, help="folder that receives one folder per variant")
    parser.add_argument("--only", nargs="+", choices=sorted(VARIANTS), metavar="NAME",
                        help=f"variants to make (default: all of {', '.join(VARIANTS)})")
    args = parser.parse_args(argv)
    args.out_root.mkdir(parents=True, exist_ok=True)
    for name in args.only or list(VARIANTS):
        make_variant(args.out_root, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
