#!/usr/bin/env python3
"""The Python-lane reference adapters (adapters/python/gh_archon: llama, qwen3_moe) against
transformers, on the tiny fixtures tools/refgen/make_checkpoint.py makes.

    GATEHOUSE_TESTDATA=/tmp/pyfix .venv/bin/python tests/python/test_archon_adapters.py

For every llama-* and qwen3_moe-* variant under GATEHOUSE_TESTDATA (default /tmp/pyfix; a
variant no adapter serves is skipped with the reason) it checks:
  config   every top-level config.json field is accounted (mapped or ignored with a reason),
           args_from_hf_config succeeds, and bad values raise ValueError naming the field;
  load     from_hf over all safetensors shards assigns every parameter with equal shapes and
           consumes every key (tied: no lm_head), an unknown key is refused, and
           to_hf(from_hf(sd)) gives back exactly the checkpoint's keys, bit-equal;
  logits   fp32 logits of every reference prompt torch.equal to the bundle's prompts.{i}.logits,
           and bf16 (model built in bf16, weights cast) to prompts.{i}.logits_bf16;
  decode   the KV-cache decode (SPEC.init_cache / decode_forward): a prefill, then one cached
           step per token along upstream's greedy ids, bit-equal to the logits transformers'
           cached generate chose them from (decode_logits, fp32 and bf16), past the sliding
           window too; a free greedy decode gives upstream's ids;
  packed   the prompts packed in one row with cu_seqlens and restarting positions give each
           sequence's own fp32 logits (bit-equal reported; max abs <= 1e-5 required);
  train    upstream's training trace in the bundle (AdamW steps): the loss per step and each
           checkpoint key's step-1 gradient norm and sum equal, fp32 and bf16;
  tp       llama-tiny-untied (and qwen3_moe-tiny-untied when present) at TP=2 over 2 CPU
           processes (gloo) agree with TP=1 (allclose, atol 1e-5).

The numerics run at the bundle's num_threads (the bundle's bars are equality only on the same
CPU kernels and thread count). Plain unittest, no pytest needed; exits non-zero on failure.
"""

from __future__ import annotations

import copy
import glob
import json
import os
import socket
import sys
import tempfile
import time
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "adapters" / "python")]
# The bundles' logits and traces were made with MKL's results independent of memory alignment
# (tools/refgen/make_checkpoint.py); bit-equality with them needs the same here (docs/bars.md).
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import gh_archon  # noqa: E402
from gatehouse_adapter import CONTRACT_VERSION, ModelSpec, assign_parameters, check_coverage  # noqa: E402

TESTDATA = Path(os.environ.get("GATEHOUSE_TESTDATA", "/tmp/pyfix"))
PACKED_ATOL = 1e-5
TP_ATOL = 1e-5
TP_VARIANTS = ("llama-tiny-untied", "qwen3_moe-tiny-untied")


def log(msg: str) -> None:
    print(msg, flush=True)


def variants() -> list[Path]:
    out = []
    for pattern in ("llama-*", "qwen3_moe-*"):
        out += [Path(p) for p in sorted(glob.glob(str(TESTDATA / pattern)))
                if (Path(p) / "checkpoint" / "config.json").is_file()]
    return out


def load_checkpoint(variant: Path) -> dict[str, torch.Tensor]:
    sd: dict[str, torch.Tensor] = {}
    for f in sorted((variant / "checkpoint").glob("*.safetensors")):
        part = load_file(str(f))
        overlap = set(sd) & set(part)
        assert not overlap, f"keys in two shards: {sorted(overlap)}"
        sd.update(part)
    return sd


def load_reference(variant: Path):
    ref = load_file(str(variant / "reference" / "reference.safetensors"))
    meta = json.loads((variant / "reference" / "reference.json").read_text())
    n = meta.get("num_prompts")
    if n is None:
        n = sum(1 for k in ref if k.endswith(".input_ids"))
    return ref, meta, n


def built(spec: ModelSpec, args, sd, dtype):
    model = spec.build_model(args, dtype, torch.device("cpu"))
    assign_parameters(model, spec.state_dict_adapter(args).from_hf(sd))
    return model


def spec_for(variant: Path):
    cfg = json.loads((variant / "checkpoint" / "config.json").read_text())
    return cfg, gh_archon.spec_for_model_type(cfg.get("model_type"))


class VariantChecks:
    """The per-variant checks, run from one TestCase method per variant and check."""

    def __init__(self, case: unittest.TestCase, variant: Path):
        self.case = case
        self.variant = variant
        self.name = variant.name
        self.cfg, self.spec = spec_for(variant)
        self._args = None
        self._sd = None

    @property
    def args(self):
        if self._args is None:
            self._args = self.spec.args_from_hf_config(copy.deepcopy(self.cfg))
        return self._args

    @property
    def sd(self):
        if self._sd is None:
            self._sd = load_checkpoint(self.variant)
        return self._sd

    # 1. config -----------------------------------------------------------------------------
    def config(self):
        c = self.case
        c.assertEqual(self.spec.contract_version, CONTRACT_VERSION)
        acc = self.spec.config_accounting(copy.deepcopy(self.cfg))
        unmapped = [k for k in self.cfg if k not in acc]
        c.assertEqual(unmapped, [], f"unmapped config fields: {unmapped}")
        for k, v in acc.items():
            c.assertTrue(v is None or (isinstance(v, str) and v), f"{k}: accounting {v!r}")
        self.args  # parses
        ignored = sorted(k for k in self.cfg if acc[k] is not None)
        # Bad values: each must raise ValueError naming the field.
        rope_field = "rope_scaling" if self.cfg.get("rope_scaling") else "rope_parameters"
        bad_rope = copy.deepcopy(self.cfg)
        bad_rope[rope_field] = dict(bad_rope.get(rope_field) or {}, rope_type="nonsense")
        bad_rope[rope_field].pop("type", None)
        cases = [
            (bad_rope, f"{rope_field}.rope_type"),
            (dict(copy.deepcopy(self.cfg), hidden_act="gelu"), "hidden_act"),
            (dict(copy.deepcopy(self.cfg),  # more KV heads than query heads never divides
                  num_key_value_heads=self.cfg["num_attention_heads"] + 1), "num_key_value_heads"),
            (dict(copy.deepcopy(self.cfg), rope_interleaved=True)
             if self.spec.name == "llama" else
             dict(copy.deepcopy(self.cfg), decoder_sparse_step=0),
             "rope_interleaved" if self.spec.name == "llama" else "decoder_sparse_step"),
        ]
        for bad, field in cases:
            with c.assertRaises(ValueError, msg=f"bad {field} accepted") as cm:
                self.spec.args_from_hf_config(bad)
            c.assertIn(f"'{field}'", str(cm.exception))
            # The accounting still answers for a config args refuses.
            self.spec.config_accounting(bad)
        return f"{len(acc)} fields accounted ({len(ignored)} ignored), bad values refused"

    # 2. load -------------------------------------------------------------------------------
    def load(self):
        c = self.case
        sd = self.sd
        adapter = self.spec.state_dict_adapter(self.args)
        mapped = adapter.from_hf(dict(sd))
        model = self.spec.build_model(self.args, torch.float32, torch.device("cpu"))
        check_coverage(model, mapped)
        n_params = len(dict(model.named_parameters()))
        if self.args.tie_word_embeddings:
            c.assertIs(model.output.weight, model.tok_embeddings.weight)
            c.assertNotIn("lm_head.weight", sd, "the tied fixture holds lm_head.weight")
            c.assertNotIn("output.weight", dict(model.named_parameters()))
        # Every checkpoint element lands in the model: element counts agree.
        c.assertEqual(sum(t.numel() for t in sd.values()),
                      sum(p.numel() for p in model.parameters()))
        back = adapter.to_hf(mapped)
        c.assertEqual(sorted(back), sorted(sd), "to_hf(from_hf(sd)) keys differ")
        for k in sd:
            c.assertEqual(back[k].dtype, sd[k].dtype, k)
            c.assertTrue(torch.equal(back[k], sd[k]), f"{k} differs after the round trip")
        # to_hf from the model's own state_dict (tied: the alias is dropped) gives the same keys.
        assign_parameters(model, mapped)
        from_model = self.spec.state_dict_adapter(self.args).to_hf(model.state_dict())
        c.assertEqual(sorted(from_model), sorted(sd))
        for k in sd:
            c.assertTrue(torch.equal(from_model[k], sd[k]), f"{k} differs from the model's")
        # An unknown key is refused, not dropped.
        with c.assertRaises((KeyError, ValueError)):
            self.spec.state_dict_adapter(self.args).from_hf(
                dict(sd, **{"model.layers.0.mystery.weight": torch.zeros(1)}))
        # convert_single_to_hf agrees with to_hf.
        name, tensor = next(iter(mapped.items()))
        single = dict(adapter.convert_single_to_hf(name, tensor))
        c.assertTrue(set(single) <= set(sd))
        shards = len(list((self.variant / "checkpoint").glob("*.safetensors")))
        return f"{len(sd)} keys in {shards} shard(s) -> {n_params} parameters, round trip bit-equal"

    # 3. logits -----------------------------------------------------------------------------
    def logits(self):
        c = self.case
        ref, meta, n = load_reference(self.variant)
        notes = []
        for dtype, suffix in ((torch.float32, ""), (torch.bfloat16, "_bf16")):
            model = built(self.spec, self.args, self.sd, dtype)
            bad = []
            with torch.no_grad():
                for i in range(n):
                    ids = ref[f"prompts.{i}.input_ids"][None]
                    pos = torch.arange(ids.shape[1])[None]
                    out = model(ids, pos)
                    c.assertEqual(out.dtype, dtype)
                    c.assertEqual(tuple(out.shape), (1, ids.shape[1], self.args.vocab_size))
                    got, want = out[0].float(), ref[f"prompts.{i}.logits{suffix}"]
                    if not torch.equal(got, want):
                        bad.append(f"prompt {i} (T={ids.shape[1]}): max abs "
                                   f"{(got - want).abs().max().item():.3g}")
            c.assertEqual(bad, [], f"{dtype} logits not bit-equal: {bad}")
            notes.append(f"{'fp32' if dtype == torch.float32 else 'bf16'} bit-equal")
        return f"{n} prompts: " + ", ".join(notes)

    # 3b. decode ----------------------------------------------------------------------------
    def decode(self):
        """The optional KV-cache decode (SPEC.init_cache / decode_forward): a prefill of the
        prompt, then one cached step per token along upstream's greedy ids, against the logits
        transformers' own cached ``generate`` chose each token from (the bundle's
        ``decode_logits``, fp32 and bf16; the prefill's row against the bundle's prompt forward,
        the same product shape), and a free greedy decode against its ids."""
        c = self.case
        if self.spec.decode_forward is None:
            return "SKIP: the SPEC gives no KV-cache decode"
        ref, meta, n = load_reference(self.variant)
        window = getattr(self.args, "sliding_window", None)
        notes, past_window = [], 0
        for dtype, suffix in ((torch.float32, ""), (torch.bfloat16, "_bf16")):
            model = built(self.spec, self.args, self.sd, dtype)
            bad, ids_bad, steps = [], [], 0
            with torch.no_grad():
                for i in range(n):
                    prompt = ref[f"prompts.{i}.input_ids"]
                    greedy = ref[f"prompts.{i}.greedy_ids{suffix}"]
                    want = ref[f"prompts.{i}.decode_logits{suffix}"]
                    t, steps_n = prompt.numel(), greedy.numel()
                    past_window += bool(window) and dtype == torch.float32 and t + steps_n - 1 > window
                    for forced in (True, False):
                        cache = self.spec.init_cache(model, 1, t + steps_n, dtype,
                                                     torch.device("cpu"))
                        out = self.spec.decode_forward(model, prompt[None],
                                                       torch.arange(t)[None], cache)
                        c.assertEqual(tuple(out.shape), (1, t, self.args.vocab_size))
                        rows = [out[0, -1]]
                        for s in range(1, steps_n):
                            token = greedy[s - 1] if forced else rows[-1].argmax()
                            out = self.spec.decode_forward(model, token.view(1, 1),
                                                           torch.tensor([[t + s - 1]]), cache)
                            rows.append(out[0, -1])
                        got = torch.stack(rows).float()
                        if forced:
                            steps += steps_n
                            # The prefill's row against the bundle's prompt forward: upstream's
                            # generate computes its logits for the last position alone
                            # (logits_to_keep=1, a [1, hidden] product), the adapter's
                            # decode_forward for every position ([T, hidden]), and MKL rounds
                            # the two shapes differently on some CPUs (an AMD EPYC: 1e-6).
                            # The bundle's prompt logits are the same [T, hidden] product.
                            prefill = ref[f"prompts.{i}.logits{suffix}"][-1].float()
                            expected = torch.cat([prefill[None], want[1:]])
                            if not torch.equal(got, expected):
                                bad.append(f"prompt {i}: max abs "
                                           f"{(got - expected).abs().max().item():.3g}")
                        elif not torch.equal(got.argmax(-1), greedy):
                            ids_bad.append(f"prompt {i}")
            c.assertEqual(bad, [], f"{dtype} cached decode steps not bit-equal to upstream's "
                                   f"cached decode: {bad}")
            c.assertEqual(ids_bad, [], f"{dtype} free greedy ids differ: {ids_bad}")
            notes.append(f"{'fp32' if dtype == torch.float32 else 'bf16'} {steps} steps bit-equal")
        where = f", {past_window} prompt(s) past the window {window}" if window else ""
        return f"{n} prompts, KV cache vs upstream's cached generate: " + ", ".join(notes) + where

    # 4. packed -----------------------------------------------------------------------------
    def packed(self):
        c = self.case
        ref, meta, n = load_reference(self.variant)
        model = built(self.spec, self.args, self.sd, torch.float32)
        seqs = [ref[f"prompts.{i}.input_ids"] for i in range(n)]
        tokens = torch.cat(seqs)[None]
        positions = torch.cat([torch.arange(s.numel()) for s in seqs])[None]
        lens = torch.tensor([s.numel() for s in seqs])
        cu = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(lens, 0).to(torch.int32)])
        with torch.no_grad():
            out = model(tokens, positions, cu_seqlens=cu, max_seqlen=int(lens.max()))[0]
        worst, equal = 0.0, True
        for i in range(n):
            got = out[int(cu[i]):int(cu[i + 1])]
            want = ref[f"prompts.{i}.logits"]
            equal &= torch.equal(got, want)
            worst = max(worst, (got - want).abs().max().item())
        c.assertLessEqual(worst, PACKED_ATOL, f"packed logits off by {worst:.3g}")
        return (f"{n} sequences in one row (T={tokens.shape[1]}): "
                + ("bit-equal" if equal else f"not bit-equal, max abs {worst:.3g} <= {PACKED_ATOL}"))


    # 5. train ------------------------------------------------------------------------------
    def train(self):
        """Upstream's training trace (reference.json "training"): AdamW steps on the prompts,
        the loss per step and each checkpoint key's step-1 gradient L2 norm and sum."""
        c = self.case
        ref, meta, n = load_reference(self.variant)
        training = meta.get("training")
        if not training:
            return "SKIP: the bundle holds no training trace"
        prompts = [ref[f"prompts.{i}.input_ids"] for i in range(n)]
        usable = [p for p in prompts if p.numel() >= 2]
        notes = []
        for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            trace = training[precision]
            model = built(self.spec, self.args, self.sd, dtype)
            model.train()
            torch.manual_seed(training["seed"])
            optimizer = torch.optim.AdamW(model.parameters(), lr=training["lr"])
            losses, norms, sums = [], {}, {}
            for step in range(1, training["steps"] + 1):
                ids = usable[(step - 1) % len(usable)]
                optimizer.zero_grad()
                logits = model(ids[:-1][None], torch.arange(ids.numel() - 1)[None]).to(torch.float32)
                loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), ids[1:])
                loss.backward()
                losses.append(loss.item())
                if step == 1:
                    grads = self.spec.state_dict_adapter(self.args).to_hf(
                        {k: p.grad for k, p in model.named_parameters()})
                    norms = {k: t.to(torch.float64).norm().item() for k, t in grads.items()}
                    sums = {k: t.to(torch.float64).sum().item() for k, t in grads.items()}
                optimizer.step()
            c.assertEqual(sorted(norms), sorted(trace["grad_norms"]), "trainable keys differ")
            diff_loss = max(abs(a - b) for a, b in zip(losses, trace["losses"]))
            bad_norms = {k: (norms[k], v) for k, v in trace["grad_norms"].items() if norms[k] != v}
            bad_sums = {k: (sums[k], v) for k, v in trace["grad_sums"].items() if sums[k] != v}
            c.assertEqual(losses, trace["losses"],
                          f"{precision} losses differ (max abs {diff_loss:.3g})")
            c.assertEqual(bad_norms, {}, f"{precision} step-1 gradient norms differ")
            c.assertEqual(bad_sums, {}, f"{precision} step-1 gradient sums differ")
            notes.append(f"{precision} bit-equal")
        return (f"{training['steps']} AdamW steps, losses and {len(norms)} step-1 gradient "
                f"norms/sums: " + ", ".join(notes))


# -- tensor parallel ---------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tp_worker(rank: int, world: int, port: int, variant_dirs: list[str], out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from datetime import timedelta

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # A bounded timeout: a rank that fails must not leave the other waiting in a collective.
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        mesh = init_device_mesh("cpu", (world,))
        _tp_run(rank, mesh, variant_dirs, out_dir)
    except NotImplementedError as e:  # an op DTensor / gloo lacks on the CPU: the test skips
        if rank == 0:
            Path(out_dir, "unsupported.txt").write_text(f"{type(e).__name__}: {e}")
    finally:
        dist.destroy_process_group()


def _tp_run(rank: int, mesh, variant_dirs: list[str], out_dir: str) -> None:
    for vd in variant_dirs:
        variant = Path(vd)
        cfg, spec = spec_for(variant)
        args = spec.args_from_hf_config(cfg)
        model = built(spec, args, load_checkpoint(variant), torch.float32)
        model = spec.parallelize(model, mesh)
        ref, _, n = load_reference(variant)
        outs = {}
        with torch.no_grad():
            for i in range(n):
                ids = ref[f"prompts.{i}.input_ids"][None]
                outs[f"{i}"] = model(ids, torch.arange(ids.shape[1])[None])[0].contiguous()
        if rank == 0:
            from safetensors.torch import save_file
            save_file(outs, os.path.join(out_dir, f"{variant.name}.safetensors"))


class ArchonAdapterTests(unittest.TestCase):
    pass


def _add_variant_tests() -> None:
    for variant in variants():
        cfg, spec = spec_for(variant)
        for check in ("config", "load", "logits", "decode", "packed", "train"):
            def test(self, variant=variant, check=check, spec=spec, cfg=cfg):
                if spec is None:
                    msg = (f"model_type {cfg.get('model_type')!r} is not served by the adapters "
                           f"({', '.join(gh_archon.FAMILIES)})")
                    log(f"{variant.name:40s} {check:7s} SKIP {msg}")
                    self.skipTest(msg)
                t0 = time.perf_counter()
                try:
                    detail = getattr(VariantChecks(self, variant), check)()
                except BaseException as e:
                    log(f"{variant.name:40s} {check:7s} FAIL {type(e).__name__}: {e}")
                    raise
                log(f"{variant.name:40s} {check:7s} ok   {detail} "
                    f"[{time.perf_counter() - t0:.1f}s]")
            setattr(ArchonAdapterTests, f"test_{variant.name}_{check}".replace("-", "_")
                    .replace(".", "_"), test)


def test_tensor_parallel(self):
    import torch.distributed as dist
    import torch.multiprocessing as mp

    dirs = [TESTDATA / v for v in TP_VARIANTS if (TESTDATA / v / "checkpoint").is_dir()]
    if not dirs:
        msg = f"none of {TP_VARIANTS} under {TESTDATA}"
        log(f"{'tp=2':40s} tp      SKIP {msg}")
        self.skipTest(msg)
    if not dist.is_available() or not dist.is_gloo_available():
        msg = "torch.distributed with gloo is not available"
        log(f"{'tp=2':40s} tp      SKIP {msg}")
        self.skipTest(msg)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gh-tp-") as out_dir:
        try:
            mp.spawn(_tp_worker, args=(2, _free_port(), [str(d) for d in dirs], out_dir),
                     nprocs=2, join=True)
        except Exception as e:  # DTensor on CPU/gloo unable to run the plan
            log(f"{'tp=2':40s} tp      FAIL {type(e).__name__}: {e}")
            raise
        unsupported = Path(out_dir, "unsupported.txt")
        if unsupported.is_file():
            msg = f"DTensor on CPU/gloo cannot run the plan: {unsupported.read_text()}"
            log(f"{'tp=2':40s} tp      SKIP {msg}")
            self.skipTest(msg)
        for d in dirs:
            cfg, spec = spec_for(d)
            args = spec.args_from_hf_config(cfg)
            model = built(spec, args, load_checkpoint(d), torch.float32)
            tp = load_file(os.path.join(out_dir, f"{d.name}.safetensors"))
            ref, _, n = load_reference(d)
            worst, equal = 0.0, True
            with torch.no_grad():
                for i in range(n):
                    ids = ref[f"prompts.{i}.input_ids"][None]
                    one = model(ids, torch.arange(ids.shape[1])[None])[0]
                    worst = max(worst, (tp[f"{i}"] - one).abs().max().item())
                    equal &= torch.equal(tp[f"{i}"], one)
                    self.assertTrue(torch.allclose(tp[f"{i}"], one, rtol=0, atol=TP_ATOL),
                                    f"{d.name} prompt {i}: TP=2 vs TP=1 max abs {worst:.3g}")
            log(f"{d.name:40s} tp      ok   TP=2 (gloo, 2 processes) vs TP=1 over {n} prompts: "
                + ("bit-equal" if equal else f"max abs {worst:.3g} <= {TP_ATOL}")
                + f" [{time.perf_counter() - t0:.1f}s]")


ArchonAdapterTests.test_zz_tensor_parallel = test_tensor_parallel


def test_protocols_example(self):
    """The complete adapter in docs/protocols.md section 9 runs as the contract says: its
    config accounting covers its config, a bad value raises ValueError naming the field, and
    from_hf / to_hf round-trip a checkpoint bit for bit into a model that computes logits."""
    import re
    import types
    from gatehouse_adapter import assign_parameters as assign
    text = (ROOT / "docs" / "protocols.md").read_text()
    section = text[text.index("## 9. The Python adapter contract"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    module = types.ModuleType("protocols_example")
    exec(compile(code, "docs/protocols.md#9", "exec"), module.__dict__)
    spec = module.SPEC
    self.assertIsInstance(spec, ModelSpec)
    self.assertEqual(spec.contract_version, CONTRACT_VERSION)
    config = {"vocab_size": 11, "hidden_size": 4, "model_type": "toy",
              "architectures": ["Toy"], "torch_dtype": "float32"}
    self.assertLessEqual(set(config), set(spec.config_accounting(config)))
    with self.assertRaisesRegex(ValueError, "vocab_size"):
        spec.args_from_hf_config({**config, "vocab_size": 0})
    args = spec.args_from_hf_config(config)
    model = spec.build_model(args, torch.float32, torch.device("cpu"))
    hf = {"model.embed_tokens.weight": torch.randn(11, 4), "lm_head.weight": torch.randn(11, 4)}
    adapter = spec.state_dict_adapter(args)
    sd = adapter.from_hf(hf)
    assign(model, sd)
    back = adapter.to_hf(sd)
    self.assertEqual(set(back), set(hf))
    self.assertTrue(all(torch.equal(back[k], hf[k]) for k in hf))
    logits = model(torch.tensor([[1, 2, 3]]), torch.tensor([[0, 1, 2]]))
    self.assertEqual(tuple(logits.shape), (1, 3, 11))
    log(f"{'docs/protocols.md section 9':40s} example ok   the contract's complete example")


ArchonAdapterTests.test_protocols_example = test_protocols_example


def main() -> int:
    if not TESTDATA.is_dir() or not variants():
        log(f"no llama-*/qwen3_moe-* fixtures under {TESTDATA}: make them with "
            "tools/refgen/make_checkpoint.py --out-root DIR (GATEHOUSE_TESTDATA=DIR)")
        return 1
    threads = set()
    for v in variants():
        ref_json = v / "reference" / "reference.json"
        if ref_json.is_file():
            threads.add(json.loads(ref_json.read_text()).get("num_threads"))
    threads.discard(None)
    if len(threads) == 1:
        torch.set_num_threads(threads.pop())
    log(f"fixtures {TESTDATA}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"{torch.backends.cpu.get_cpu_capability()}")
    _add_variant_tests()
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(ArchonAdapterTests)
    result = unittest.TextTestRunner(verbosity=0, stream=sys.stderr).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
