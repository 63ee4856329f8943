#!/usr/bin/env python3
"""The false-FAIL suite's Python-lane variant adapters (tools/variants/python: gh_titan, gh_areal,
gh_upstream) against the reference bundles' envelope of correct implementations.

    GATEHOUSE_TESTDATA=/tmp/titanfx .venv/bin/python tests/python/test_variant_adapters.py

Each variant adapter is a correct implementation that computes in its own floating-point order
(complex RoPE on permuted q/k rows, scaled_dot_product_attention, torch's RMSNorm, ...), so the
bundle's bit-exact bars do not apply; the envelope's margins do (docs/bars.md,
tools/refgen/envelope.py). Adapters are discovered over a list of module names (DEFAULT_MODULES,
the python entries of tools/variants/manifest.json, and any <package>/<family>/spec.py of the
variant packages): what exists is imported, what does not is reported and passed over, a module
that exists and fails to import fails. For each adapter and each fixture under GATEHOUSE_TESTDATA
(default /tmp/titanfx) whose config.json model_type it serves:

  config   every top-level config.json field accounted (mapped, or ignored with a reason),
           args_from_hf_config succeeds (a refusal must be a ValueError naming the field; the
           fixture's other checks are then skipped with it);
  refuse   bad values (rope_type "nonsense", more KV heads than query heads) raise ValueError
           naming the field, as contract v1 asks, and the accounting still answers;
  load     from_hf covers the model (gatehouse_adapter.check_coverage), an unknown key is
           refused, to_hf(from_hf(sd)) and to_hf(model.state_dict()) give back exactly the
           checkpoint's keys, bit-equal;
  logits   fp32 and bf16 prompt logits against the bundle's prompts.{i}.logits / logits_bf16:
           max abs diff <= 4 x env.max_abs_diff, mean per-token KL(upstream || ours) <=
           16 x env.kl_mean, top-1 agreement >= 100 - 2 x (100 - env.top1_percent), with
           env = reference.json envelope[precision].prompt;
  packed   the prompts packed in one row (cu_seqlens, positions restarting at 0) against each
           prompt alone through the same adapter, fp32: KL per token <= 1e-9;
  train    upstream's AdamW trace (reference.json training.fp32 / bf16): step-1 loss rel diff
           <= 4 x max(env.first_loss_rel, 2^-23), later steps <= 4 x max(max(env.loss_rel),
           2^-23), per checkpoint key (to_hf of the gradients) the step-1 gradient L2-norm rel
           diff and the gradient-sum diff / (sqrt(numel) x norm) <= 4 x max(env.grad_norm_rel,
           env.grad_sum_rel, 2^-23);
and per adapter: its fp32 logits are not bit-equal to the bundle's on at least one fixture (it
really computes in another order, so the suite tests the margins and not equality).

A fixture without a bundle, or whose bundle has no envelope, is skipped with the reason. The
numerics run at the bundle's num_threads, with MKL_CBWR=AUTO,STRICT as the bundles were made. At
the end a table prints, per adapter x fixture x precision, each figure beside its bar.
Plain unittest; exits non-zero on failure.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import math
import os
import sys
import time
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VARIANTS_DIR = ROOT / "tools" / "variants" / "python"
sys.path[:0] = [str(ROOT / "python"), str(VARIANTS_DIR)]
# The bundles were made with MKL's results independent of memory alignment
# (tools/refgen/make_checkpoint.py); the same here keeps the comparison about the adapter.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from gatehouse_adapter import CONTRACT_VERSION, ModelSpec, assign_parameters, check_coverage  # noqa: E402

TESTDATA = Path(os.environ.get("GATEHOUSE_TESTDATA", "/tmp/titanfx"))
VARIANT_PACKAGES = ("gh_titan", "gh_areal", "gh_upstream")
DEFAULT_MODULES = ("gh_titan.llama.spec", "gh_titan.qwen3.spec", "gh_areal.qwen3.spec",
                   "gh_upstream.llama.spec", "gh_upstream.qwen3.spec")
PACKED_KL_MAX = 1e-9
EPS32 = 2.0 ** -23
PRECISIONS = (("fp32", torch.float32, ""), ("bf16", torch.bfloat16, "_bf16"))


def log(msg: str) -> None:
    print(msg, flush=True)


# -- discovery -------------------------------------------------------------------------------

def candidate_modules() -> list[str]:
    names = list(DEFAULT_MODULES)
    manifest = ROOT / "tools" / "variants" / "manifest.json"
    if manifest.is_file():
        for v in json.loads(manifest.read_text()).get("variants", []):
            if v.get("lane") == "python":
                names += [e.split(":", 1)[0] for e in v.get("entries", [])]
    for pkg in VARIANT_PACKAGES:
        for spec_py in sorted((VARIANTS_DIR / pkg).glob("*/spec.py")):
            names.append(f"{pkg}.{spec_py.parent.name}.spec")
    return list(dict.fromkeys(names))


def _exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def discover() -> tuple[dict[str, ModelSpec], dict[str, str], list[str]]:
    """({adapter name: SPEC}, {adapter name: import error}, [modules absent])."""
    specs, broken, absent = {}, {}, []
    for module in candidate_modules():
        name = module[:-len(".spec")] if module.endswith(".spec") else module
        if not _exists(module):
            absent.append(module)
            continue
        try:
            spec = getattr(importlib.import_module(module), "SPEC")
            if not isinstance(spec, ModelSpec):
                raise TypeError(f"SPEC is a {type(spec).__name__}, not a ModelSpec")
            specs[name] = spec
        except Exception as e:  # noqa: BLE001 (reported as a failing test)
            broken[name] = f"{type(e).__name__}: {e}"
    return specs, broken, absent


def fixtures() -> list[Path]:
    if not TESTDATA.is_dir():
        return []
    return [p for p in sorted(TESTDATA.iterdir()) if (p / "checkpoint" / "config.json").is_file()]


# -- data, cached ----------------------------------------------------------------------------

_CACHE: dict = {}


def cached(key, make):
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


def config_of(fixture: Path) -> dict:
    return json.loads((fixture / "checkpoint" / "config.json").read_text())


def checkpoint(fixture: Path) -> dict[str, torch.Tensor]:
    def make():
        sd: dict[str, torch.Tensor] = {}
        for f in sorted((fixture / "checkpoint").glob("*.safetensors")):
            part = load_file(str(f))
            overlap = set(sd) & set(part)
            assert not overlap, f"keys in two shards: {sorted(overlap)}"
            sd.update(part)
        return sd
    return cached(("sd", fixture), make)


def bundle(fixture: Path):
    """(tensors, meta, prompts) of the fixture's reference bundle, or None when absent."""
    ref_dir = fixture / "reference"
    if not (ref_dir / "reference.json").is_file() or not (ref_dir / "reference.safetensors").is_file():
        return None

    def make():
        tensors = load_file(str(ref_dir / "reference.safetensors"))
        meta = json.loads((ref_dir / "reference.json").read_text())
        n = meta.get("num_prompts") or sum(1 for k in tensors if k.endswith(".input_ids"))
        return tensors, meta, [tensors[f"prompts.{i}.input_ids"] for i in range(n)]
    return cached(("bundle", fixture), make)


def use_bundle_threads(meta: dict) -> None:
    n = meta.get("num_threads")
    if n and torch.get_num_threads() != int(n):
        torch.set_num_threads(int(n))


def built(spec: ModelSpec, args, sd, dtype):
    """(model with the checkpoint's weights in dtype, the adapter that loaded them)."""
    adapter = spec.state_dict_adapter(args)
    model = spec.build_model(args, dtype, torch.device("cpu"))
    assign_parameters(model, adapter.from_hf(dict(sd)))
    return model, adapter


# -- figures ---------------------------------------------------------------------------------

class Spread:
    """The gates' comparison of [N, V] logit rows (tools/refgen/envelope.py Spread)."""

    def __init__(self):
        self.max_abs, self.kl_sum, self.kl_max, self.agree, self.rows = 0.0, 0.0, 0.0, 0, 0
        self.equal = True

    def add(self, ref: torch.Tensor, ours: torch.Tensor) -> torch.Tensor:
        ref, ours = ref.to(torch.float32), ours.to(torch.float32)
        self.equal &= torch.equal(ref, ours)
        self.max_abs = max(self.max_abs, (ref - ours).abs().max().item())
        log_p = torch.log_softmax(ref.double(), -1)
        log_q = torch.log_softmax(ours.double(), -1)
        kl = (log_p.exp() * (log_p - log_q)).sum(-1).clamp_min(0.0)
        self.kl_sum += kl.sum().item()
        self.kl_max = max(self.kl_max, kl.max().item())
        self.agree += int((ref.argmax(-1) == ours.argmax(-1)).sum().item())
        self.rows += ref.shape[0]
        return kl

    @property
    def kl_mean(self) -> float:
        return self.kl_sum / max(self.rows, 1)

    @property
    def top1(self) -> float:
        return 100.0 * self.agree / max(self.rows, 1)


ROWS: list[dict] = []   # the table: adapter, fixture, precision, figure, value, bar, op, ok


def record(adapter: str, fixture: str, precision: str, figure: str, value: float, bar: float,
           op: str = "<=", env: str = "") -> bool:
    ok = value <= bar if op == "<=" else value >= bar
    ROWS.append(dict(adapter=adapter, fixture=fixture, precision=precision, figure=figure,
                     value=value, bar=bar, op=op, ok=ok, env=env))
    return ok


def fmt(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 1e-2 and abs(x) < 1e4:
        return f"{x:.4g}"
    return f"{x:.3e}"


# -- the checks ------------------------------------------------------------------------------

class Skip(Exception):
    pass


class Checks:
    """One adapter on one fixture."""

    def __init__(self, case: unittest.TestCase, adapter: str, spec: ModelSpec, fixture: Path):
        self.case, self.adapter, self.spec, self.fixture = case, adapter, spec, fixture
        self.name = fixture.name
        self.cfg = config_of(fixture)

    # the parsed args, or Skip with the adapter's refusal
    @property
    def args(self):
        def make():
            try:
                return ("ok", self.spec.args_from_hf_config(copy.deepcopy(self.cfg)))
            except ValueError as e:
                return ("refused", str(e))
        status, value = cached(("args", self.adapter, self.fixture), make)
        if status == "refused":
            raise Skip(f"the adapter refuses this config: {value}")
        return value

    def needs_bundle(self, envelope: bool = True):
        b = bundle(self.fixture)
        if b is None:
            raise Skip(f"no reference bundle under {self.fixture / 'reference'}")
        tensors, meta, prompts = b
        if envelope and not meta.get("envelope"):
            raise Skip("the bundle has no envelope (tools/refgen/envelope.py --bundle ... "
                       "--checkpoint ...)")
        use_bundle_threads(meta)
        return tensors, meta, prompts

    def env(self, meta, precision: str) -> dict:
        env = meta["envelope"].get(precision)
        if env is None:
            raise Skip(f"the envelope has no {precision} figures")
        return env

    # 1. config -----------------------------------------------------------------------------
    def config(self):
        c = self.case
        c.assertEqual(self.spec.contract_version, CONTRACT_VERSION)
        acc = self.spec.config_accounting(copy.deepcopy(self.cfg))
        unmapped = [k for k in self.cfg if k not in acc]
        c.assertEqual(unmapped, [], f"unmapped config fields: {unmapped}")
        for k, v in acc.items():
            c.assertTrue(v is None or (isinstance(v, str) and v), f"{k}: accounting {v!r}")
        ignored = sorted(k for k in self.cfg if acc[k] is not None)
        try:
            self.spec.args_from_hf_config(copy.deepcopy(self.cfg))
        except ValueError as e:
            c.assertIn("'", str(e), f"refusal names no field: {e}")
            return f"{len(acc)} fields accounted; the adapter refuses the config: {e}"
        return f"{len(acc)} fields accounted ({len(ignored)} ignored), args parsed"

    # 1b. refuse ----------------------------------------------------------------------------
    def refuse(self):
        """Contract v1: a bad value raises ValueError naming the field."""
        c = self.case
        self.args  # noqa: B018 (skips when the adapter refuses the fixture's config)
        rope_field = "rope_scaling" if self.cfg.get("rope_scaling") else "rope_parameters"
        bad_rope = copy.deepcopy(self.cfg)
        bad_rope[rope_field] = dict(bad_rope.get(rope_field) or {}, rope_type="nonsense")
        bad_rope[rope_field].pop("type", None)
        cases = [(bad_rope, "rope_type"),
                 (dict(copy.deepcopy(self.cfg),
                       num_key_value_heads=self.cfg["num_attention_heads"] + 1),
                  "num_key_value_heads")]
        for bad, field in cases:
            with c.assertRaises(ValueError, msg=f"bad {field} accepted") as cm:
                self.spec.args_from_hf_config(bad)
            c.assertIn(field, str(cm.exception))
            self.spec.config_accounting(bad)  # still answers
        return ("rope_type \"nonsense\" and num_key_value_heads > num_attention_heads refused "
                "naming the field")

    # 2. load -------------------------------------------------------------------------------
    def load(self):
        c = self.case
        args, sd = self.args, checkpoint(self.fixture)
        adapter = self.spec.state_dict_adapter(args)
        mapped = adapter.from_hf(dict(sd))
        model = self.spec.build_model(args, torch.float32, torch.device("cpu"))
        check_coverage(model, mapped)
        c.assertEqual(sum(t.numel() for t in sd.values()),
                      sum(p.numel() for p in model.parameters()),
                      "checkpoint and model element counts differ")
        back = adapter.to_hf(mapped)
        c.assertEqual(sorted(back), sorted(sd), "to_hf(from_hf(sd)) keys differ")
        for k in sd:
            c.assertEqual(back[k].dtype, sd[k].dtype, k)
            c.assertTrue(torch.equal(back[k], sd[k]), f"{k} differs after the round trip")
        assign_parameters(model, mapped)
        from_model = adapter.to_hf(model.state_dict())
        c.assertEqual(sorted(from_model), sorted(sd), "to_hf(model.state_dict()) keys differ")
        for k in sd:
            c.assertTrue(torch.equal(from_model[k], sd[k]), f"{k} differs from the model's")
        with c.assertRaises((KeyError, ValueError)):
            self.spec.state_dict_adapter(args).from_hf(
                dict(sd, **{"model.layers.0.mystery.weight": torch.zeros(1)}))
        return (f"{len(sd)} keys -> {len(dict(model.named_parameters()))} parameters, coverage "
                "exact, round trip bit-equal")

    # 3. logits -----------------------------------------------------------------------------
    def fp32_equal(self) -> bool:
        """Whether every fp32 prompt logit equals the bundle's (cached)."""
        def make():
            tensors, meta, prompts = self.needs_bundle(envelope=False)
            model, _ = built(self.spec, self.args, checkpoint(self.fixture), torch.float32)
            with torch.no_grad():
                return all(torch.equal(model(p[None], torch.arange(p.numel())[None])[0].float(),
                                       tensors[f"prompts.{i}.logits"])
                           for i, p in enumerate(prompts))
        return cached(("fp32_equal", self.adapter, self.fixture), make)

    def logits(self):
        c = self.case
        tensors, meta, prompts = self.needs_bundle()
        notes, failures = [], []
        for precision, dtype, suffix in PRECISIONS:
            env = self.env(meta, precision)["prompt"]
            model, _ = built(self.spec, self.args, checkpoint(self.fixture), dtype)
            s = Spread()
            with torch.no_grad():
                for i, ids in enumerate(prompts):
                    out = model(ids[None], torch.arange(ids.numel())[None])
                    c.assertEqual(out.dtype, dtype, "logits not in the model dtype")
                    c.assertEqual(out.shape[:2], (1, ids.numel()))
                    s.add(tensors[f"prompts.{i}.logits{suffix}"], out[0])
            if precision == "fp32":
                _CACHE[("fp32_equal", self.adapter, self.fixture)] = s.equal
            bars = (("logits max abs diff", s.max_abs, 4 * env["max_abs_diff"], "<=",
                     f"4 x {fmt(env['max_abs_diff'])} ({env.get('max_abs_diff_from', '?')})"),
                    ("logits KL mean", s.kl_mean, 16 * env["kl_mean"], "<=",
                     f"16 x {fmt(env['kl_mean'])} ({env.get('kl_mean_from', '?')})"),
                    ("logits top-1 %", s.top1, 100 - 2 * (100 - env["top1_percent"]), ">=",
                     f"100 - 2 x (100 - {fmt(env['top1_percent'])})"))
            for figure, value, bar, op, how in bars:
                if not record(self.adapter, self.name, precision, figure, value, bar, op, how):
                    failures.append(f"{precision} {figure} {fmt(value)} not {op} {fmt(bar)} "
                                    f"= {how}")
            notes.append(f"{precision} max abs {fmt(s.max_abs)}, KL {fmt(s.kl_mean)}, top-1 "
                         f"{fmt(s.top1)}%" + (" (bit-equal)" if s.equal else ""))
        c.assertEqual(failures, [], "outside the envelope's margins")
        return "; ".join(notes)

    # 4. packed -----------------------------------------------------------------------------
    def packed(self):
        c = self.case
        tensors, meta, prompts = self.needs_bundle(envelope=False)
        model, _ = built(self.spec, self.args, checkpoint(self.fixture), torch.float32)
        tokens = torch.cat(prompts)[None]
        positions = torch.cat([torch.arange(p.numel()) for p in prompts])[None]
        lens = torch.tensor([p.numel() for p in prompts])
        cu = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(lens, 0).to(torch.int32)])
        s = Spread()
        with torch.no_grad():
            out = model(tokens, positions, cu_seqlens=cu, max_seqlen=int(lens.max()))[0]
            for i, ids in enumerate(prompts):
                alone = model(ids[None], torch.arange(ids.numel())[None])[0]
                s.add(alone, out[int(cu[i]):int(cu[i + 1])])
        ok = record(self.adapter, self.name, "fp32", "packed vs alone KL max per token",
                    s.kl_max, PACKED_KL_MAX, "<=", "fixed")
        c.assertTrue(ok, f"packed logits KL per token {s.kl_max:.3g} > {PACKED_KL_MAX}")
        return (f"{len(prompts)} sequences in one row (T={tokens.shape[1]}): KL max per token "
                f"{fmt(s.kl_max)}, max abs {fmt(s.max_abs)}" + (" (bit-equal)" if s.equal else ""))

    # 5. train ------------------------------------------------------------------------------
    def train(self):
        c = self.case
        tensors, meta, prompts = self.needs_bundle()
        training = meta.get("training")
        if not training:
            raise Skip("the bundle holds no training trace")
        usable = [p for p in prompts if p.numel() >= 2]
        steps = training["steps"]
        notes, failures = [], []
        for precision, dtype, _ in PRECISIONS:
            trace = training[precision]
            env = self.env(meta, precision)["training"]
            model, adapter = built(self.spec, self.args, checkpoint(self.fixture), dtype)
            model.train()
            torch.manual_seed(training["seed"])
            optimizer = torch.optim.AdamW(model.parameters(), lr=training["lr"])
            losses, norms, sums, numel = [], {}, {}, {}
            for step in range(1, steps + 1):
                ids = usable[(step - 1) % len(usable)]
                optimizer.zero_grad()
                logits = model(ids[:-1][None], torch.arange(ids.numel() - 1)[None]).to(torch.float32)
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), ids[1:])
                loss.backward()
                losses.append(loss.item())
                if step == 1:
                    missing = [k for k, p in model.named_parameters() if p.grad is None]
                    c.assertEqual(missing, [], "parameters without a gradient")
                    grads = adapter.to_hf({k: p.grad for k, p in model.named_parameters()})
                    for k, g in grads.items():
                        g = g.to(torch.float64)
                        norms[k], sums[k], numel[k] = g.norm().item(), g.sum().item(), g.numel()
                optimizer.step()
            c.assertEqual(sorted(norms), sorted(trace["grad_norms"]), "trainable keys differ")

            def rel(a, b):
                return abs(a - b) / abs(b) if b else abs(a - b)
            loss_rel = [rel(a, b) for a, b in zip(losses, trace["losses"])]
            grad_rel, grad_key, sum_rel, sum_key = 0.0, "", 0.0, ""
            for k, want in trace["grad_norms"].items():
                r = rel(norms[k], want)
                if r >= grad_rel:
                    grad_rel, grad_key = r, k
                scale = math.sqrt(numel[k]) * want
                d = abs(sums[k] - trace["grad_sums"][k])
                r = d / scale if scale > 0 else d
                if r >= sum_rel:
                    sum_rel, sum_key = r, k
            env_first = max(env["first_loss_rel"], EPS32)
            env_later = max(max(env["loss_rel"][:steps]), EPS32)
            env_grad = max(env["grad_norm_rel"], env["grad_sum_rel"], EPS32)
            bars = [("train step-1 loss rel", loss_rel[0], 4 * env_first,
                     f"4 x max({fmt(env['first_loss_rel'])}, 2^-23)")]
            if steps > 1:
                worst = max(range(1, steps), key=lambda i: loss_rel[i])
                bars.append((f"train later loss rel (worst: step {worst + 1})", loss_rel[worst],
                             4 * env_later,
                             f"4 x max({fmt(max(env['loss_rel'][:steps]))}, 2^-23)"))
            how = (f"4 x max({fmt(env['grad_norm_rel'])}, {fmt(env['grad_sum_rel'])}, 2^-23)")
            bars += [(f"train step-1 grad norm rel ({grad_key})", grad_rel, 4 * env_grad, how),
                     (f"train step-1 grad sum scaled ({sum_key})", sum_rel, 4 * env_grad, how)]
            for figure, value, bar, how in bars:
                if not record(self.adapter, self.name, precision, figure, value, bar, "<=", how):
                    failures.append(f"{precision} {figure} {fmt(value)} > {fmt(bar)} = {how}")
            notes.append(f"{precision} losses rel max {fmt(max(loss_rel))}, grad norm rel "
                         f"{fmt(grad_rel)}, grad sum {fmt(sum_rel)}")
        c.assertEqual(failures, [], "outside the envelope's margins")
        return f"{steps} AdamW steps, {len(norms)} keys: " + "; ".join(notes)


CHECKS = ("config", "refuse", "load", "logits", "packed", "train")


class VariantAdapterTests(unittest.TestCase):
    pass


def _name(*parts: str) -> str:
    return "test_" + "__".join(p.replace("-", "_").replace(".", "_") for p in parts)


def _add_tests(specs: dict[str, ModelSpec], broken: dict[str, str]) -> None:
    for adapter, err in broken.items():
        def test(self, adapter=adapter, err=err):
            log(f"{adapter:20s} {'':28s} import  FAIL {err}")
            self.fail(f"{adapter}: {err}")
        setattr(VariantAdapterTests, _name(adapter, "import"), test)

    for adapter, spec in specs.items():
        served = [f for f in fixtures() if config_of(f).get("model_type") in spec.model_types]
        for fixture in served:
            for check in CHECKS:
                def test(self, adapter=adapter, spec=spec, fixture=fixture, check=check):
                    t0 = time.perf_counter()
                    try:
                        detail = getattr(Checks(self, adapter, spec, fixture), check)()
                    except Skip as e:
                        log(f"{adapter:20s} {fixture.name:28s} {check:7s} SKIP {e}")
                        self.skipTest(str(e))
                    except BaseException as e:
                        log(f"{adapter:20s} {fixture.name:28s} {check:7s} FAIL "
                            f"{type(e).__name__}: {e}")
                        raise
                    log(f"{adapter:20s} {fixture.name:28s} {check:7s} ok   {detail} "
                        f"[{time.perf_counter() - t0:.1f}s]")
                setattr(VariantAdapterTests, _name(adapter, fixture.name, check), test)

        def not_bit_exact(self, adapter=adapter, spec=spec, served=served):
            """The adapter computes in its own order: its fp32 logits differ from upstream's
            somewhere (else the suite would test equality, not the margins)."""
            seen, differs = [], []
            for fixture in served:
                checks = Checks(self, adapter, spec, fixture)
                try:
                    equal = checks.fp32_equal()
                except Skip:
                    continue
                seen.append(fixture.name)
                if not equal:
                    differs.append(fixture.name)
            if not seen:
                msg = f"no fixture with a bundle that {adapter} serves under {TESTDATA}"
                log(f"{adapter:20s} {'':28s} order   SKIP {msg}")
                self.skipTest(msg)
            if not differs:
                log(f"{adapter:20s} {'':28s} order   FAIL fp32 logits bit-equal to upstream's "
                    f"on every fixture ({', '.join(seen)})")
            self.assertTrue(differs, f"{adapter}: fp32 logits bit-equal to the bundles' on "
                                     f"every fixture ({seen}): not a reordered implementation")
            log(f"{adapter:20s} {'':28s} order   ok   fp32 logits not bit-equal to upstream's "
                f"on {len(differs)}/{len(seen)} fixtures ({', '.join(differs)})")
        setattr(VariantAdapterTests, _name("zz", adapter, "not_bit_exact"), not_bit_exact)


def print_table() -> None:
    if not ROWS:
        return
    log("")
    log(f"Variant adapters against the envelope (fixtures {TESTDATA}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s))")
    log("")
    log("| adapter | fixture | precision | figure | value | bar | bar from envelope | |")
    log("|---|---|---|---|---|---|---|---|")
    for r in ROWS:
        log(f"| {r['adapter']} | {r['fixture']} | {r['precision']} | {r['figure']} | "
            f"{fmt(r['value'])} | {r['op']} {fmt(r['bar'])} | {r['env']} | "
            f"{'ok' if r['ok'] else 'OUTSIDE'} |")


def main() -> int:
    specs, broken, absent = discover()
    log(f"fixtures {TESTDATA}, torch {torch.__version__}, "
        f"{torch.backends.cpu.get_cpu_capability()}, MKL_CBWR={os.environ.get('MKL_CBWR')}")
    log(f"adapters: {', '.join(specs) or 'none'}"
        + (f"; failing to import: {', '.join(broken)}" if broken else "")
        + (f"; absent (passed over): {', '.join(absent)}" if absent else ""))
    if not fixtures():
        log(f"no fixtures under {TESTDATA}: make them with tools/refgen/make_checkpoint.py "
            "--out-root DIR and tools/refgen/envelope.py (GATEHOUSE_TESTDATA=DIR)")
        return 1
    threads = set()
    for f in fixtures():
        b = bundle(f)
        if b is not None and b[1].get("num_threads"):
            threads.add(int(b[1]["num_threads"]))
    if len(threads) == 1:
        torch.set_num_threads(threads.pop())
    _add_tests(specs, broken)
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(VariantAdapterTests)
    result = unittest.TextTestRunner(verbosity=0, stream=sys.stderr).run(suite)
    print_table()
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
