#!/usr/bin/env python3
"""The framework shims (python/gatehouse_adapter/frameworks: archon, torchtitan) and the shared
config reader / name map (gatehouse_adapter.config, gatehouse_adapter.names), without the C++
build and without fixtures: tiny configs written here, random weights.

    .venv/bin/python tests/python/test_framework_shims.py

It checks:
  reader   ConfigReader / Fields refusals are ValueErrors naming the field and the value (types,
           ranges, "only" values and list elements, divides on config.json and on the config
           class's defaults, RoPE type / keys / partial factor, unread flags, model_type); the
           accounting (mapped, ignored with a reason, unmapped left out, the fallback when the
           config is refused); KeyMap (layer index carried, n_layers bound, None refused) and the
           tied-alias rule;
  config   each shim builds transformers' config object from the dict (AutoConfig.for_model:
           class defaults, RoPE standardised) and hands it to the framework's reader, every
           fixture-like config.json field accounted; the worker's own path (lane.load_spec,
           parse_config, gate_facts) accepts the ports' SPECs;
  forward  Archon: an unpacked [B>1, T] call on a model whose forward requires cu_seqlens equals
           B packed calls with cu_seqlens = [0, T] (bit-equal), "pack" mode matches to rounding,
           a packed call passes through; torchtitan: a packed call equals each sequence alone,
           a forward without positions gets 0..T-1 and refuses other positions;
  tie      the framework's tie flag read (``enable_weight_tying`` from tie_word_embeddings),
           the output projection is the embedding's Parameter, counted once;
  weights  round trip to the checkpoint's keys; a key the framework's adapter drops (Archon's
           inv_freq -> None, a key without a template, a template removed) is refused naming
           it; a tied lm_head.weight equal to the embedding consumed and given back, a different
           one refused; a key the framework's to_hf invents refused;
  parallel the 1-D tp mesh as the framework's ParallelDims (tp only, no loss parallelism, no
           compile / FSDP / CP) and job config; a parallelize_fn that unties the embedding is
           refused; TP=2 over gloo (2 CPU processes) for one port of each shim agrees with TP=1;
and the mutations the shims must catch (each named in its test): a framework reader that ignores
the tie flag, an adapter dropping a key, an adapter inventing one, a parallelize_fn breaking the
tie, a caller asking a position-less model for restarted positions.

Plain unittest; exits non-zero on failure.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import socket
import sys
import tempfile
import unittest
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "tools" / "variants" / "python")]
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from gatehouse_adapter import (ConfigReader, Fields, KeyMap, assign_parameters,  # noqa: E402
                               check_coverage, check_tied_alias, lane)
from gatehouse_adapter.frameworks import archon, torchtitan  # noqa: E402
from gatehouse_adapter.frameworks._common import TensorParallelDims  # noqa: E402

torch.set_num_threads(1)

# config.json as transformers 5.24's save_pretrained writes them for tiny models (the fields of
# tools/refgen's qwen2 / qwen3 / llama fixtures).
COMMON = {"architectures": ["X"], "attention_dropout": 0.0, "bos_token_id": 1, "dtype": "float32",
          "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
          "intermediate_size": 128, "max_position_embeddings": 512, "num_attention_heads": 4,
          "num_hidden_layers": 2, "num_key_value_heads": 2, "pad_token_id": None,
          "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": 50000.0, "rope_type": "default"},
          "tie_word_embeddings": False, "transformers_version": "5.24.0", "use_cache": True,
          "vocab_size": 256}
QWEN2 = dict(COMMON, model_type="qwen2", layer_types=["full_attention"] * 2,
             max_window_layers=28, sliding_window=None, use_sliding_window=False)
QWEN3 = dict(QWEN2, model_type="qwen3", attention_bias=False, head_dim=32)
LLAMA = dict(COMMON, model_type="llama", attention_bias=False, head_dim=16, mlp_bias=False,
             pretraining_tp=1)


def cfg(base: dict, **changes) -> dict:
    out = copy.deepcopy(base)
    out.update(changes)
    return out


def spec_of(module: str):
    return lane.load_spec(f"{module}:SPEC")


def random_checkpoint(spec, config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """A checkpoint under Hugging Face names for the port: random weights through to_hf."""
    args = spec.args_from_hf_config(copy.deepcopy(config))
    model = spec.build_model(args, torch.float32, torch.device("cpu"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return {k: v.clone() for k, v in
            spec.state_dict_adapter(args).to_hf(dict(model.named_parameters())).items()}


def loaded(spec, config: dict, sd: dict, dtype=torch.float32):
    args = spec.args_from_hf_config(copy.deepcopy(config))
    adapter = spec.state_dict_adapter(args)
    model = spec.build_model(args, dtype, torch.device("cpu"))
    assign_parameters(model, adapter.from_hf(dict(sd)))
    return model, adapter, args


def refuses(case: unittest.TestCase, fn, *fragments: str, exc=ValueError) -> str:
    with case.assertRaises(exc) as cm:
        fn()
    msg = str(cm.exception)
    for f in fragments:
        case.assertIn(f, msg)
    return msg


# -- the reader and the name map --------------------------------------------------------------

class ReaderTests(unittest.TestCase):
    def test_typed_reads_name_field_and_value(self):
        r = ConfigReader({"a": -3, "b": float("nan"), "c": "yes", "d": "gelu", "e": 2, "f": True,
                          "g": 4096.0})
        refuses(self, lambda: r.positive_int("a"), "'a'", "-3", "positive")
        refuses(self, lambda: r.number("b"), "'b'", "NaN")
        refuses(self, lambda: r.bool("c", False), "'c'", '"yes"')
        refuses(self, lambda: r.string_in("d", "silu", ("silu",), "activation"), "'d'", '"gelu"')
        refuses(self, lambda: r.must_be("e", 1, 1, "only 1"), "'e'", "2", "only 1")
        refuses(self, lambda: r.int("g"), "'g'", "4096.0", "integer")
        refuses(self, lambda: r.int("missing"), "'missing'", "required")
        refuses(self, lambda: r.ignore_unread_flag("f", "unread", "refused: asks for X"),
                "'f'", "true", "asks for X")
        refuses(self, lambda: ConfigReader([1, 2]), "JSON object")

    def test_accounting(self):
        r = ConfigReader({"x": 1, "y": 2, "z": 3, "w": 4})
        r.raw("x")
        r.ignore("y", "no effect")
        r.raw("w")
        r.ignore("w", "declared after the read: the later declaration wins")
        self.assertEqual(r.accounting(), {"x": None, "y": "no effect",
                                          "w": "declared after the read: the later "
                                               "declaration wins"})
        r.raw("y")  # read after it was ignored: mapped wins
        self.assertIsNone(r.accounting()["y"])

    def test_fields_refusals(self):
        f = Fields(model_types=("qwen3",), sizes=("hidden_size", "num_attention_heads",
                                                  "num_key_value_heads"),
                   numbers=("rms_norm_eps",), flags=("tie_word_embeddings",),
                   only={"attention_bias": ((False,), "no biases"),
                         "layer_types[]": (("full_attention",), "causal everywhere")},
                   divides=(("num_key_value_heads", "num_attention_heads"),),
                   rope_types=("default",), ignored={"sliding_window": "off here"})
        base = cfg(QWEN3)
        f.read(base)
        cases = [
            (dict(model_type="llama"), ["'model_type'", '"llama"']),
            (dict(hidden_size=0), ["'hidden_size'", "0", "positive"]),
            (dict(rms_norm_eps=-1.0), ["'rms_norm_eps'", "-1.0"]),
            (dict(tie_word_embeddings="no"), ["'tie_word_embeddings'", '"no"']),
            (dict(attention_bias=True), ["'attention_bias'", "true", "no biases"]),
            (dict(layer_types=["full_attention", "sliding_attention"]),
             ["'layer_types[1]'", '"sliding_attention"', "causal everywhere"]),
            (dict(num_key_value_heads=3), ["'num_key_value_heads'", "3", "does not divide"]),
            (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0}),
             ["'rope_parameters.rope_type'", '"yarn"']),
            (dict(rope_parameters={"rope_type": "default", "factor": 4.0}),
             ["'rope_parameters.factor'", "4.0"]),
            (dict(rope_parameters=None, rope_scaling={"type": "linear", "factor": 2.0}),
             ["'rope_scaling.type'", '"linear"']),
            (dict(partial_rotary_factor=0.5), ["'partial_rotary_factor'", "0.5"]),
            (dict(rope_parameters={"rope_theta": -1.0, "rope_type": "default"}),
             ["'rope_parameters.rope_theta'", "-1.0"]),
        ]
        for change, fragments in cases:
            with self.subTest(change=change):
                bad = cfg(base, **change)
                refuses(self, lambda: f.read(bad), *fragments)
                acc = f.accounting(bad)   # still answers: every declared field present mapped
                self.assertEqual([k for k in f.declared() if k in bad and acc.get(k, 1)], [])
        acc = f.accounting(base)
        self.assertEqual(acc["sliding_window"], "off here")
        self.assertEqual(acc["architectures"][:12], "transformers")
        self.assertIsNone(acc["hidden_size"])
        # Not declared: unmapped (absent from the accounting, the config gate FAILs on it).
        self.assertNotIn("max_window_layers", acc)
        # divides on the config class's defaults: Qwen3Config's num_key_value_heads is 32.
        from gatehouse_adapter.frameworks._common import read_config
        no_kv = {k: v for k, v in base.items() if k != "num_key_value_heads"}
        refuses(self, lambda: read_config(f, no_kv), "'num_key_value_heads'", "32",
                "config class's defaults")

    def test_unread_flags(self):
        f = Fields(unread_flags={"rope_interleaved": ("never read", "asks for interleaved")})
        self.assertEqual(f.accounting({"rope_interleaved": False})["rope_interleaved"],
                         "never read")
        refuses(self, lambda: f.read({"rope_interleaved": True}), "'rope_interleaved'", "true")
        self.assertIn("rope_interleaved", f.accounting({"rope_interleaved": True}))

    def test_keymap(self):
        km = KeyMap({"model.layers.{}.mlp.up_proj.weight": "layers.{}.ffn.w3.weight",
                     "model.norm.weight": "norm.weight"}, n_layers=2)
        self.assertEqual(km.hf_to_model("model.layers.1.mlp.up_proj.weight"),
                         "layers.1.ffn.w3.weight")
        self.assertEqual(km.model_to_hf("layers.0.ffn.w3.weight"),
                         "model.layers.0.mlp.up_proj.weight")
        self.assertIsNone(km.hf_to_model("model.layers.2.mlp.up_proj.weight"))  # no layer 2
        self.assertEqual(km.hf_to_model("model.norm.weight"), "norm.weight")
        refuses(self, lambda: KeyMap({"a.inv_freq": None}), "a.inv_freq")
        e = torch.ones(3, 2)
        check_tied_alias({"lm_head.weight": e.clone(), "model.embed_tokens.weight": e})
        refuses(self, lambda: check_tied_alias({"lm_head.weight": e + 1,
                                                "model.embed_tokens.weight": e}),
                "lm_head.weight", "model.embed_tokens.weight")

    def test_moved_paths_reexport(self):
        import gatehouse_adapter.config as shared
        import gh_areal.config
        import gh_titan.common.config
        for mod in (gh_areal.config, gh_titan.common.config):
            self.assertIs(mod.ConfigReader, shared.ConfigReader)


# -- Archon ---------------------------------------------------------------------------------

class ArchonShimTests(unittest.TestCase):
    spec = None

    @classmethod
    def setUpClass(cls):
        cls.spec = spec_of("gh_areal.qwen2.spec")
        cls.sd = random_checkpoint(cls.spec, QWEN2)

    def test_config_object_and_worker_path(self):
        from gh_areal.qwen2 import Qwen2ModelArgs
        args, acc, err = lane.parse_config(self.spec, json.dumps(QWEN2))
        self.assertIsNone(err)
        self.assertEqual([k for k in QWEN2 if k not in acc], [])
        self.assertIsInstance(args, Qwen2ModelArgs)
        from gatehouse_adapter.frameworks._common import recalled
        hf = recalled(args, "hf_config")
        self.assertEqual(type(hf).__name__, "Qwen2Config")
        self.assertEqual((args.dim, args.n_kv_heads, args.head_dim, args.rope_theta),
                         (64, 2, 16, 50000.0))   # head_dim: derived; theta: rope_parameters
        facts = lane.gate_facts(self.spec, args)
        self.assertEqual(facts["num_hidden_layers"], 2)
        self.assertFalse(facts["tie_word_embeddings"])
        _, _, err = lane.parse_config(self.spec, json.dumps(cfg(QWEN2, use_sliding_window=True)))
        self.assertIn("'use_sliding_window'", err)
        json.loads(lane.args_json(args))   # the evidence's args

    def test_unpacked_rows_equal_per_row_packed_calls(self):
        model, _, _ = loaded(self.spec, QWEN2, self.sd)
        tokens = torch.randint(0, 256, (3, 11), generator=torch.Generator().manual_seed(1))
        positions = torch.arange(11).expand(3, 11)
        with torch.no_grad():
            out = lane.forward(model, tokens, positions)
            cu = torch.tensor([0, 11], dtype=torch.int32)
            rows = [model.framework_forward(tokens[b:b + 1], positions[b:b + 1], cu, 11)
                    for b in range(3)]
            # The framework's forward requires cu_seqlens: the contract's call alone fails.
            with self.assertRaises(TypeError):
                model.framework_forward(tokens, positions)
        self.assertEqual(out.shape, (3, 11, 256))
        self.assertTrue(torch.equal(out, torch.cat(rows)), "rows differ from packed calls")
        # A packed row passes through (max_seqlen computed).
        packed_tokens, pos = tokens.reshape(1, 33), torch.arange(11).repeat(3)[None]
        cu3 = torch.tensor([0, 11, 22, 33])
        with torch.no_grad():
            packed = lane.forward(model, packed_tokens, pos, cu3)
            direct = model.framework_forward(packed_tokens, pos, cu3.to(torch.int32), 11)
        self.assertTrue(torch.equal(packed, direct))
        self.assertTrue(torch.allclose(packed.reshape(3, 11, -1), out, atol=1e-5))
        # unpacked="pack": the rows packed into one row, as Archon's engine feeds them.
        from gh_areal.qwen2 import QWEN2_SPEC
        from gh_areal.qwen2.spec import FIELDS
        pack = archon.model_spec(QWEN2_SPEC, fields=FIELDS, unpacked="pack")
        pmodel, _, _ = loaded(pack, QWEN2, self.sd)
        with torch.no_grad():
            self.assertTrue(torch.allclose(pmodel(tokens, positions), out, atol=1e-5))

    def test_tie_flag_read_and_tied(self):
        tied = cfg(QWEN2, tie_word_embeddings=True)
        sd = {k: v for k, v in self.sd.items() if k != "lm_head.weight"}
        model, adapter, args = loaded(self.spec, tied, sd)
        self.assertTrue(args.enable_weight_tying)
        self.assertIs(model.output.weight, model.tok_embeddings.weight)
        self.assertNotIn("output.weight", dict(model.named_parameters()))
        self.assertEqual(sorted(adapter.to_hf(model.state_dict())), sorted(sd))
        # A checkpoint that keeps lm_head.weight equal to the embedding: consumed, given back.
        sd2 = dict(sd, **{"lm_head.weight": sd["model.embed_tokens.weight"].clone()})
        m2, a2, _ = loaded(self.spec, tied, sd2)
        self.assertEqual(sorted(a2.to_hf(dict(m2.named_parameters()))), sorted(sd2))
        # ... and one whose lm_head.weight differs: refused.
        sd3 = dict(sd, **{"lm_head.weight": sd["model.embed_tokens.weight"] + 1})
        refuses(self, lambda: loaded(self.spec, tied, sd3), "output.weight",
                "tok_embeddings.weight")

    def test_mutation_reader_ignores_tie_flag(self):
        from gh_areal.qwen2 import QWEN2_SPEC, Qwen2ModelArgs
        from gh_areal.qwen2.spec import FIELDS

        @dataclasses.dataclass
        class Untying(Qwen2ModelArgs):
            @classmethod
            def from_hf_config(cls, hf_config, is_critic=False, **kw):
                args = super().from_hf_config(hf_config, **kw)
                args.enable_weight_tying = False    # reads another name: never tied
                return args

        bad = archon.model_spec(dataclasses.replace(QWEN2_SPEC, model_args_class=Untying),
                                fields=FIELDS)
        refuses(self, lambda: bad.args_from_hf_config(cfg(QWEN2, tie_word_embeddings=True)),
                "'tie_word_embeddings'", "true", "enable_weight_tying = False")

    def test_dropped_keys_refused(self):
        args = self.spec.args_from_hf_config(cfg(QWEN2))
        extra = {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8),
                 "model.layers.0.mystery.weight": torch.ones(2)}
        for key, value in extra.items():
            with self.subTest(key=key):
                refuses(self, lambda: self.spec.state_dict_adapter(args).from_hf(
                    dict(self.sd, **{key: value})), key, "drops", exc=KeyError)
        # Mutation: a template missing from the framework's table (the k_proj bias).
        from gh_areal.qwen2 import QWEN2_SPEC, Qwen2StateDictAdapter
        from gh_areal.qwen2.spec import FIELDS

        class Forgetful(Qwen2StateDictAdapter):
            def __init__(self, model_config, hf_assets_path=None):
                super().__init__(model_config, hf_assets_path)
                del self.from_hf_map["model.layers.{}.self_attn.k_proj.bias"]

        bad = archon.model_spec(dataclasses.replace(QWEN2_SPEC, state_dict_adapter_class=Forgetful),
                                fields=FIELDS)
        msg = refuses(self, lambda: bad.state_dict_adapter(bad.args_from_hf_config(cfg(QWEN2)))
                      .from_hf(dict(self.sd)), exc=KeyError)
        for layer in (0, 1):
            self.assertIn(f"model.layers.{layer}.self_attn.k_proj.bias", msg)

    def test_mutation_adapter_invents_a_key(self):
        from gh_areal.qwen2 import QWEN2_SPEC, Qwen2StateDictAdapter
        from gh_areal.qwen2.spec import FIELDS

        class Inventive(Qwen2StateDictAdapter):
            def to_hf(self, state_dict):
                out = super().to_hf(state_dict)
                out["model.rotary_emb.inv_freq"] = torch.ones(8)
                return out

        bad = archon.model_spec(dataclasses.replace(QWEN2_SPEC, state_dict_adapter_class=Inventive),
                                fields=FIELDS)
        refuses(self, lambda: bad.state_dict_adapter(bad.args_from_hf_config(cfg(QWEN2)))
                .from_hf(dict(self.sd)), "model.rotary_emb.inv_freq", "lacks")

    def test_parallel_dims_mapping(self):
        from gh_areal.qwen2 import QWEN2_SPEC
        from gh_areal.qwen2.spec import FIELDS
        seen = {}

        def recorder(model, parallel_dims, **kwargs):
            seen.update(dims=parallel_dims, kwargs=kwargs)
            return model

        def untier(model, parallel_dims, **kwargs):
            model.output.weight = nn.Parameter(model.output.weight.detach().clone())
            return model

        mesh = SimpleNamespace(size=lambda: 4, device_type="cpu", get_group=lambda: "group")
        for fn, tie in ((recorder, False), (untier, True)):
            spec = archon.model_spec(dataclasses.replace(QWEN2_SPEC, parallelize_fn=fn),
                                     fields=FIELDS)
            config = cfg(QWEN2, tie_word_embeddings=tie)
            model = spec.build_model(spec.args_from_hf_config(config), torch.float32,
                                     torch.device("cpu"))
            if fn is recorder:
                self.assertIs(spec.parallelize(model, mesh), model)
            else:   # Mutation: a parallelize_fn that leaves the tie broken.
                refuses(self, lambda: spec.parallelize(model, mesh), "output.weight",
                        "tok_embeddings.weight")
        dims, kwargs = seen["dims"], seen["kwargs"]
        self.assertEqual((dims.tp, dims.world_size, dims.cp, dims.dp_shard, dims.pp), (4, 4, 1, 1, 1))
        self.assertTrue(dims.tp_enabled)
        self.assertFalse(dims.fsdp_enabled or dims.cp_enabled or dims.pp_enabled or dims.ep_enabled)
        self.assertIs(dims.get_mesh("tp"), mesh)
        self.assertIsNone(dims.get_mesh("dp_shard_cp"))
        self.assertEqual(dims.get_group("tp"), "group")
        self.assertEqual((kwargs["loss_parallel"], kwargs["enable_compile"], kwargs["ac_config"],
                          kwargs["param_dtype"]), (False, False, None, torch.float32))


# -- torchtitan ------------------------------------------------------------------------------

class NoPositions(nn.Module):
    """A torchtitan-style model whose forward takes tokens only (positions 0..T-1 per row)."""

    def __init__(self, model_args):
        super().__init__()
        self.model_args = model_args
        self.tok_embeddings = nn.Embedding(model_args.vocab_size, model_args.dim)
        self.output = nn.Linear(model_args.dim, model_args.vocab_size, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        h = torch.cumsum(h, dim=1) / torch.arange(1, tokens.shape[1] + 1)[None, :, None]
        return self.output(h)   # causal: each column mixes its own prefix only


@dataclasses.dataclass
class ToyArgs:   # no tie flag, as torchtitan's Llama 3 args
    vocab_size: int = 16
    dim: int = 8
    n_layers: int = 1
    n_heads: int = 2
    n_kv_heads: int = 2
    max_seq_len: int = 64

    @classmethod
    def from_hf_config(cls, hf):
        return cls(vocab_size=hf.vocab_size, dim=hf.hidden_size, n_heads=hf.num_attention_heads)


class ToyAdapter:
    def __init__(self, model_args, hf_assets_path):
        self.keys = KeyMap({"model.embed_tokens.weight": "tok_embeddings.weight",
                            "lm_head.weight": "output.weight"})

    def from_hf(self, sd):
        return {self.keys.hf_to_model(k): v for k, v in sd.items()}

    def to_hf(self, sd):
        return {self.keys.model_to_hf(k): v for k, v in sd.items()}


class TorchtitanShimTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.spec = spec_of("gh_titan.llama.spec")
        cls.sd = random_checkpoint(cls.spec, LLAMA)
        cls.toy = torchtitan.model_spec(
            SimpleNamespace(model_cls=NoPositions, model_args={"toy": ToyArgs()},
                            state_dict_adapter=ToyAdapter, parallelize_fn=None),
            name="toy", model_types=("llama",), fields=Fields(mapped=tuple(LLAMA)))

    def test_config_object(self):
        from gh_titan.llama import TransformerModelArgs
        scaled = cfg(LLAMA, rope_parameters=None, rope_theta=50000.0,
                     rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 64})
        args, acc, err = lane.parse_config(self.spec, json.dumps(scaled))
        self.assertIsNone(err)
        self.assertIsInstance(args, TransformerModelArgs)
        self.assertEqual((args.rope.rope_type, args.rope.factor, args.rope.theta,
                          args.rope.original_max_position_embeddings), ("llama3", 8.0, 50000.0, 64))
        self.assertEqual([k for k in scaled if k not in acc], [])
        _, _, err = lane.parse_config(self.spec, json.dumps(cfg(LLAMA, mlp_bias=True)))
        self.assertIn("'mlp_bias'", err)
        _, _, err = lane.parse_config(self.spec, json.dumps(cfg(LLAMA, rope_interleaved=True)))
        self.assertIn("'rope_interleaved'", err)

    def test_packed_equals_each_sequence_alone(self):
        model, _, _ = loaded(self.spec, LLAMA, self.sd)
        g = torch.Generator().manual_seed(2)
        seqs = [torch.randint(0, 256, (n,), generator=g) for n in (5, 9, 3)]
        tokens = torch.cat(seqs)[None]
        positions = torch.cat([torch.arange(len(s)) for s in seqs])[None]
        cu = torch.tensor([0, 5, 14, 17], dtype=torch.int64)
        with torch.no_grad():
            packed = lane.forward(model, tokens, positions, cu)
            alone = [model(s[None], torch.arange(len(s))[None]) for s in seqs]
            # The framework's own forward: tokens and positions, no cu_seqlens.
            direct = model.framework_forward(seqs[1][None], positions=torch.arange(9)[None])
        self.assertTrue(torch.equal(packed, torch.cat(alone, dim=1)))
        self.assertTrue(torch.equal(alone[1], direct))

    def test_forward_without_positions(self):
        model = self.toy.build_model(self.toy.args_from_hf_config(cfg(LLAMA)), torch.float32,
                                     torch.device("cpu"))
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():   # storage only so far (the worker assigns a checkpoint's)
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        tokens = torch.randint(0, 256, (2, 6), generator=g)
        with torch.no_grad():
            out = model(tokens, torch.arange(6).expand(2, 6))
            self.assertTrue(torch.equal(out, model.framework_forward(tokens)))
            packed = model(tokens[:1], torch.tensor([[0, 1, 2, 0, 1, 2]]),
                           torch.tensor([0, 3, 6]))
            self.assertTrue(torch.equal(packed[:, 3:], model.framework_forward(tokens[:1, 3:])))
            # Mutation caught: positions the model cannot be given.
            refuses(self, lambda: model(tokens, torch.arange(1, 7).expand(2, 6)),
                    "takes no positions")

    def test_tie_flag(self):
        tied = cfg(LLAMA, tie_word_embeddings=True)
        sd = {k: v for k, v in self.sd.items() if k != "lm_head.weight"}
        model, adapter, args = loaded(self.spec, tied, sd)
        self.assertTrue(args.enable_weight_tying)
        self.assertIs(model.output.weight, model.tok_embeddings.weight)
        self.assertTrue(lane.gate_facts(self.spec, args)["tie_word_embeddings"])
        self.assertEqual(sorted(adapter.to_hf(model.state_dict())), sorted(sd))
        sd3 = dict(sd, **{"lm_head.weight": sd["model.embed_tokens.weight"] * 2})
        refuses(self, lambda: loaded(self.spec, tied, sd3), "tied")
        # Mutation: framework args without a tie flag serving a tied checkpoint.
        refuses(self, lambda: self.toy.args_from_hf_config(tied), "'tie_word_embeddings'",
                "no enable_weight_tying")

    def test_weights_round_trip_and_unknown_key(self):
        model, adapter, _ = loaded(self.spec, LLAMA, self.sd)
        check_coverage(model, adapter.from_hf(dict(self.sd)))
        back = adapter.to_hf(dict(model.named_parameters()))
        self.assertEqual(sorted(back), sorted(self.sd))
        for k in self.sd:   # q/k rows permuted there and back: bit-equal
            self.assertTrue(torch.equal(back[k], self.sd[k]), k)
        refuses(self, lambda: adapter.from_hf(dict(self.sd, **{"model.layers.0.x.weight":
                                                                torch.ones(1)})),
                "model.layers.0.x.weight", exc=KeyError)

    def test_parallel_dims_and_job_config(self):
        from gh_titan.llama import get_train_spec
        from gh_titan.llama.spec import FIELDS
        seen = {}

        def recorder(model, parallel_dims, job_config):
            seen.update(dims=parallel_dims, jc=job_config)
            return model

        spec = torchtitan.model_spec(dataclasses.replace(get_train_spec(), parallelize_fn=recorder),
                                     name="llama", model_types=("llama",), fields=FIELDS)
        model = spec.build_model(spec.args_from_hf_config(cfg(LLAMA)), torch.bfloat16,
                                 torch.device("cpu"))
        mesh = SimpleNamespace(size=lambda: 2, device_type="cpu")
        spec.parallelize(model, mesh)
        dims, jc = seen["dims"], seen["jc"]
        self.assertIsInstance(dims, TensorParallelDims)
        self.assertEqual(dims.tp, 2)
        self.assertIs(dims.get_mesh("tp"), mesh)
        self.assertTrue(jc.parallelism.disable_loss_parallel)
        self.assertFalse(jc.compile.enable)
        self.assertEqual(jc.activation_checkpoint.mode, "none")
        self.assertEqual(jc.training.mixed_precision_param, "bfloat16")
        self.assertEqual(jc.training.seq_len % dims.seq_len_divisor, 0)


# -- tensor parallelism over gloo -------------------------------------------------------------

TP_CASES = (("gh_areal.qwen3.spec", QWEN3, True), ("gh_titan.llama.spec", LLAMA, False))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tp_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        mesh = init_device_mesh("cpu", (world,))
        for module, config, tied in TP_CASES:
            spec = lane.load_spec(f"{module}:SPEC")
            config = cfg(config, tie_word_embeddings=tied)
            sd = random_checkpoint(spec, config, seed=3)
            model, _, _ = loaded(spec, config, sd)
            model = spec.parallelize(model, mesh)
            tokens = torch.randint(0, 256, (2, 13), generator=torch.Generator().manual_seed(4))
            with torch.no_grad():
                out = model(tokens, torch.arange(13).expand(2, 13))
            if rank == 0:
                torch.save(out, Path(out_dir, f"{module}.pt"))
        # Both ranks leave together: rank 0 holds the store, and a rank still tearing down its
        # group when the other exits can abort.
        dist.barrier()
    finally:
        dist.destroy_process_group()


class TensorParallelTests(unittest.TestCase):
    def test_tp2_matches_tp1(self):
        import torch.multiprocessing as mp
        with tempfile.TemporaryDirectory() as out_dir:
            mp.spawn(_tp_worker, args=(2, _free_port(), out_dir), nprocs=2, join=True)
            for module, config, tied in TP_CASES:
                spec = spec_of(module)
                config = cfg(config, tie_word_embeddings=tied)
                model, _, _ = loaded(spec, config, random_checkpoint(spec, config, seed=3))
                tokens = torch.randint(0, 256, (2, 13), generator=torch.Generator().manual_seed(4))
                with torch.no_grad():
                    ref = model(tokens, torch.arange(13).expand(2, 13))
                tp = torch.load(Path(out_dir, f"{module}.pt"))
                diff = (tp - ref).abs().max().item()
                print(f"  {module}: TP=2 vs TP=1 max abs {diff:.3g}", file=sys.stderr)
                self.assertLessEqual(diff, 1e-5, module)


if __name__ == "__main__":
    unittest.main(verbosity=2)
