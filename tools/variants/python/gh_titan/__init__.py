"""A Gatehouse Python adapter (contract v1, gatehouse_adapter) that writes Llama 3 and dense
Qwen3 the way torchtitan (github.com/pytorch/torchtitan, torchtitan/models/llama3 and
torchtitan/models/common) writes its decoders, keeping its numerical choices on purpose rather
than transformers' order of operations:

* RoPE as complex numbers: the frequencies precomputed in fp32 as ``freqs_cis`` with
  ``torch.polar``, applied by ``torch.view_as_complex`` on interleaved (re, im) pairs of
  ``x.float()``, a complex multiply, ``view_as_real``, ``flatten`` and ``type_as``. The q/k
  projection rows are permuted from the checkpoint's rotate-half layout into interleaved pairs
  when loading (and back when saving), as torchtitan's Hugging Face state-dict adapter does;
  Qwen3's per-head q/k norm weights are permuted with them.
* attention through ``torch.nn.functional.scaled_dot_product_attention`` (``is_causal`` for a
  plain row, a block-diagonal causal mask for a packed row, ``enable_gqa`` for grouped heads);
* RMSNorm as ``torch.nn.RMSNorm`` (``F.rms_norm``: fp32 statistics, the weight applied before
  the cast back);
* a SwiGLU feed-forward ``w2(silu(w1(x)) * w3(x))``; logits in the model dtype.

The code is in torchtitan's shape -- a ``TrainSpec`` per family (``gh_titan.<family>.get_train_spec()``:
model class, args, ``parallelize_fn(model, parallel_dims, job_config)``, a state-dict adapter
built from the args), ``forward(tokens, attention_masks=None, positions=None)`` without
cu_seqlens, ``enable_weight_tying`` -- and is presented to Gatehouse through
``gatehouse_adapter.frameworks.torchtitan`` by a short spec module per family, which also
declares what of config.json it computes (gatehouse_adapter.Fields). torchtitan builds args
from named flavors; here the args classes read transformers' config object
(``from_hf_config``).

A correct implementation that does not follow transformers op for op: material for the gates'
false-FAIL suite (tools/variants/manifest.json). Families: ``gh_titan.llama.spec.SPEC``
(model_type "llama") and ``gh_titan.qwen3.spec.SPEC`` (model_type "qwen3").

Imports torch and gatehouse_adapter; the shim reads config.json through transformers.
"""

import importlib

FAMILIES = ("llama", "qwen3")


def spec(name: str):
    """The ModelSpec of family `name`."""
    if name not in FAMILIES:
        raise KeyError(f"unknown family {name!r} (known: {', '.join(FAMILIES)})")
    return importlib.import_module(f"gh_titan.{name}.spec").SPEC


def spec_for_model_type(model_type: str):
    """The ModelSpec serving a Hugging Face model_type, or None."""
    for name in FAMILIES:
        s = spec(name)
        if model_type in s.model_types:
            return s
    return None
