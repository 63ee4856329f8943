#!/usr/bin/env python3
"""Make a checkpoint the way a user of Gatehouse has one: a model saved by transformers'
save_pretrained, of a model type none of Gatehouse's families serves (Ministral), with no
reference bundle beside it (Gatehouse's reference cell must make it).

    make_user_checkpoint.py OUT_DIR

Writes OUT_DIR/config.json, model.safetensors and generation_config.json. The weights are
seeded and scaled like tools/refgen's (unit-scale activations, norms away from 1), so logits
are far from uniform and greedy decoding does not sit on near-ties; every layer slides with a
window of 24 tokens, so a prompt longer than 24 tokens shows an adapter that ignores it.
"""
import sys
from pathlib import Path

import torch
import transformers


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[1])
    torch.manual_seed(20261201)
    config = transformers.MinistralConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=512, sliding_window=24, rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
        bos_token_id=1, eos_token_id=2, pad_token_id=0, attn_implementation="eager")
    model = transformers.MinistralForCausalLM(config).to(torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            elif "embed_tokens" in name:
                param.normal_(0.0, 0.5)
            else:
                param.normal_(0.0, param.shape[-1] ** -0.5)
    model.save_pretrained(str(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
