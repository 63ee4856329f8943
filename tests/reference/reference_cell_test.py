#!/usr/bin/env python3
"""tools/refgen/reference_cell.py on checkpoints a user could bring, made here with transformers
itself (none of tools/refgen's variants):

  * olmo2: a tiny Olmo2ForCausalLM with a tokenizer trained here (tokenizers BPE, wrapped in
    PreTrainedTokenizerFast, bos/eos/pad and a jinja chat template), and a generation_config.json
    asking for repetition_penalty / no_repeat_ngram_size / sampling (which plain greedy must
    ignore);
  * qwen2: a tiny Qwen2 with a sliding window in use (40 tokens), no tokenizer;
  * llama: a tiny Llama with llama3 RoPE scaling (original_max_position_embeddings 64), no
    tokenizer.

Run:  python tests/reference/reference_cell_test.py [--worker PATH/gatehouse-worker] [unittest args]
Without --worker (or a missing file) the `gatehouse-worker --check-reference` checks are skipped
with a printed reason. Takes about a minute on 2 CPU cores.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "refgen" / "reference_cell.py"
sys.path.insert(0, str(SCRIPT.parent))
import reference_cell  # noqa: E402  (directory_digest, constants)

WORKER = None  # set from --worker
TORCH = torch.__version__.split("+")[0]
UNITS = {"count", "bytes", "ms", "tokens/s", "ratio", "nats", "percent", "text", "logits"}
STATUSES = {"PASS", "FAIL", "BLOCKED", "UNKNOWN", "SKIPPED"}

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)
SENTENCES = [
    "The capital of France is Paris.",
    "What is the capital of France? Answer in one sentence.",
    "Hello world, this is a tiny tokenizer for a tiny model.",
    "Small models repeat tokens when their weights are random.",
    "The quick brown fox jumps over the lazy dog.",
]
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def make_tokenizer(directory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=[
        "<pad>", "<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>"])
    tok.train_from_iterator(SENTENCES, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    assert tok.get_vocab_size() <= 256, tok.get_vocab_size()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                pad_token="<pad>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(directory))


def make_checkpoints(root):
    torch.manual_seed(1234)
    olmo2 = transformers.Olmo2ForCausalLM(transformers.Olmo2Config(
        **TINY, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False))
    # A generation_config.json as published checkpoints ship them: none of it is plain greedy.
    olmo2.generation_config = transformers.GenerationConfig(
        bos_token_id=1, eos_token_id=2, pad_token_id=0, do_sample=True, temperature=0.7,
        repetition_penalty=1.5, no_repeat_ngram_size=2)
    olmo2.save_pretrained(str(root / "olmo2"))
    make_tokenizer(root / "olmo2")

    torch.manual_seed(1235)
    qwen2 = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **TINY, max_position_embeddings=256, use_sliding_window=True, sliding_window=40,
        max_window_layers=0, bos_token_id=1, eos_token_id=2))
    assert "sliding_attention" in qwen2.config.layer_types, qwen2.config.layer_types
    qwen2.save_pretrained(str(root / "qwen2"))

    torch.manual_seed(1236)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **TINY, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
        rope_scaling=dict(rope_type="llama3", factor=8.0, original_max_position_embeddings=64,
                          low_freq_factor=1.0, high_freq_factor=4.0)))
    llama.save_pretrained(str(root / "llama"))

    # Upstream's own logits overflow: one vocabulary row of lm_head at 3e38.
    overflow = root / "overflow"
    shutil.copytree(root / "llama", overflow)
    weights = load_file(str(overflow / "model.safetensors"))
    weights["lm_head.weight"][5] = 3e38
    save_file(weights, str(overflow / "model.safetensors"), metadata={"format": "pt"})

    corrupt = root / "corrupt"
    shutil.copytree(root / "llama", corrupt)
    config = json.loads((corrupt / "config.json").read_text())
    config["model_type"] = "no_such_model"
    (corrupt / "config.json").write_text(json.dumps(config, indent=2))


class ReferenceCellTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix="reference-cell-test-")
        cls.root = Path(cls._tmp.name)
        make_checkpoints(cls.root)
        cls.attempts = 0

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    # --- helpers ---------------------------------------------------------------------------

    def run_spec(self, checkpoint, prompts=None, digest=None, torch_pin=TORCH, transformers_pin=None,
                 max_new_tokens=4, steps=2):
        """Writes run.json into a fresh attempt dir, runs run-spec mode with --out under it.
        Returns (events, attempt dir, out dir)."""
        type(self).attempts += 1
        attempt = self.root / f"attempt{self.attempts}"
        attempt.mkdir()
        ckpt = self.root / checkpoint
        spec = {
            "spec_version": 1, "kind": "reference", "repository": "", "commit": "",
            "model_family": "",
            "checkpoint": {"path": str(ckpt),
                           "digest": digest or reference_cell.directory_digest(ckpt)},
            "runtime": {"torch": torch_pin, "device": "cpu",
                        "transformers": transformers_pin if transformers_pin is not None
                        else transformers.__version__},
            "decode": {"max_new_tokens": max_new_tokens, "sampling": "greedy"},
            "training": {"steps": steps, "lr": 0.001, "seed": 1234},
            "env": {}, "phases": ["identity", "reference"],
            "attempt": {"id": self.attempts, "dir": str(attempt),
                        "checkout": {"head": "", "clean": True, "path": ""}, "agent": "test"},
        }
        if prompts is not None:
            spec["prompts"] = prompts
        (attempt / "run.json").write_text(json.dumps(spec, indent=2))
        out = attempt / "reference"
        proc = subprocess.run([sys.executable, str(SCRIPT), "--run-spec", str(attempt / "run.json"),
                               "--out", str(out)], cwd=attempt, capture_output=True, text=True,
                              timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr[-4000:])
        events = []
        for line in proc.stdout.splitlines():
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                self.fail(f"stdout line is not JSON: {line!r}\nstderr: {proc.stderr[-2000:]}")
            self.assertIsInstance(ev, dict)
            self.assertIn("event", ev)
            self.assertIsInstance(ev.get("ts_ms"), int, ev)
            events.append(ev)
        self.check_protocol(events)
        self.stderr = proc.stderr
        return events, attempt, out

    def check_protocol(self, events):
        self.assertTrue(events, "no events")
        self.assertEqual(events[-1]["event"], "run_end", events[-1])
        self.assertEqual(sum(e["event"] == "run_end" for e in events), 1)
        ends = [e for e in events if e["event"] == "phase_end"]
        self.assertEqual([e["phase"] for e in ends], ["identity", "reference"])
        for e in ends:
            self.assertIn(e["status"], STATUSES)
            self.assertIsInstance(e["duration_ms"], int)
            if e["status"] != "PASS":
                self.assertTrue(e["reason"], e)
            self.assertEqual(bool(e["classification"]), e["status"] == "FAIL", e)
        for e in events:
            if e["event"] == "figure":
                self.assertIn(e["unit"], UNITS, e)
                self.assertIsInstance(e["value"], (int, float, str), e)
        statuses = {e["status"] for e in ends}
        want = next((s for s in ("FAIL", "BLOCKED", "UNKNOWN") if s in statuses), "PASS")
        self.assertEqual(events[-1]["status"], want)

    @staticmethod
    def phase_end(events, phase):
        return next(e for e in events if e["event"] == "phase_end" and e["phase"] == phase)

    @staticmethod
    def figures(events, phase):
        return {e["name"]: e["value"] for e in events if e["event"] == "figure" and e["phase"] == phase}

    def assert_pass_bundle(self, events, attempt, out, max_new_tokens=4):
        """Everything a PASS run must show; returns (reference.json, tensors)."""
        for phase in ("identity", "reference"):
            end = self.phase_end(events, phase)
            self.assertEqual(end["status"], "PASS", end)
        self.assertEqual(events[-1]["status"], "PASS")
        ident = self.figures(events, "identity")
        self.assertEqual(ident["torch"], TORCH)
        self.assertEqual(ident["transformers"], transformers.__version__)
        self.assertTrue(ident["checkpoint_digest"].startswith("sha256:"))
        figs = self.figures(events, "reference")
        for name in ("num_prompts", "max_new_tokens", "duration_ms", "peak_rss_bytes"):
            self.assertIn(name, figs)
        self.assertEqual(figs["max_new_tokens"], max_new_tokens)
        self.assertGreater(figs["peak_rss_bytes"], 10 << 20)  # KiB turned into bytes
        arts = {e["name"]: e for e in events if e["event"] == "artifact"}
        self.assertEqual(set(arts), {"reference.json", "reference.safetensors"})
        for name, art in arts.items():
            self.assertEqual(art["phase"], "reference")
            self.assertEqual(art["path"], f"reference/{name}")  # relative to the attempt dir
            path = attempt / art["path"]
            self.assertTrue(path.is_file())
            self.assertEqual(art["bytes"], path.stat().st_size)
            self.assertEqual(art["sha256"], sha256(path))
        self.assertEqual(sorted(p.name for p in out.iterdir()),
                         ["reference.json", "reference.safetensors"])
        self.assertEqual(sorted(p.name for p in attempt.iterdir()), ["reference", "run.json"],
                         "no staging folder left beside the bundle")
        meta = json.loads((out / "reference.json").read_text())
        tensors = load_file(str(out / "reference.safetensors"))
        self.assertEqual(meta["format"], "gatehouse-reference/2")
        self.assertEqual(meta["kind"], "reference_cell")
        self.assertEqual(meta["checkpoint_digest"], ident["checkpoint_digest"])
        self.assertEqual(meta["max_new_tokens"], max_new_tokens)
        self.assertEqual(meta["training"]["steps"], 2)
        self.assertEqual(len(meta["training"]["fp32"]["losses"]), 2)
        self.assertEqual(meta["num_prompts"], figs["num_prompts"])
        self.assertEqual([c["index"] for c in meta["prompts_chosen"]], list(range(meta["num_prompts"])))
        for i in range(meta["num_prompts"]):
            ids = tensors[f"prompts.{i}.input_ids"]
            self.assertEqual(figs[f"prompt_{i}_length"], ids.numel())
            self.assertEqual(meta["prompts_chosen"][i]["length"], ids.numel())
            for suffix in ("", "_bf16"):
                greedy = tensors[f"prompts.{i}.greedy_ids{suffix}"]
                self.assertEqual(greedy.numel(), max_new_tokens)
                # Plain greedy: each token is the argmax of the logits it was chosen from, whatever
                # the checkpoint's generation_config.json asks for.
                self.assertEqual(greedy.tolist(),
                                 tensors[f"prompts.{i}.decode_logits{suffix}"].argmax(-1).tolist(),
                                 f"prompt {i}{suffix}")
        # The envelope of correct implementations (tools/refgen/envelope.py), measured with the
        # bundle: every variation of this model that upstream accepts, the canonical path
        # reproduced exactly by its harness, its cost a figure of the phase.
        env = meta["envelope"]
        self.assertIn("combined", env["variations"])
        self.assertIn("rope=complex", env["variations"])
        for precision in ("fp32", "bf16"):
            e = env[precision]
            self.assertTrue(e["harness_exact"], e["harness"])
            self.assertEqual(set(e["by_variation"]), set(env["variations"]))
            self.assertEqual(len(e["training"]["loss_rel"]), 2)
            for section in ("prompt", "decode_steps"):
                self.assertGreaterEqual(e[section]["max_abs_diff"], 0.0)
                self.assertIn(e[section]["max_abs_diff_from"], env["variations"])
            # Version 2: the rollout/training log-prob gap and packed-vs-alone spread, worst
            # over upstream's own run and the variations; a decode and a forward never agree
            # to the last bit in fp32 (other matrix shapes).
            self.assertEqual(env["version"], 2)
            if precision == "fp32":
                self.assertGreater(e["logprobs"]["max_abs_diff"], 0.0)
            self.assertGreaterEqual(e["logprobs"]["max_abs_diff"], e["logprobs"]["mean_abs_diff"])
            sources = {"canonical"} | set(env["variations"]) | {
                v + " against canonical" for v in env["variations"]}
            self.assertIn(e["logprobs"]["max_abs_diff_from"], sources)
            for figure in ("kl_max", "loss_rel", "grad_rel"):
                self.assertGreaterEqual(e["packing"][figure], 0.0)
                self.assertIn(e["packing"][figure + "_from"], {"canonical"} | set(env["variations"]))
        self.assertGreater(figs["envelope_ms"], 0)
        # Where the time and memory went: one figure pair per stage of make_reference.
        self.assertEqual([s["stage"] for s in meta["stages"]],
                         ["forwards", "training_fp32", "training_bf16", "envelope"])
        for st in meta["stages"]:
            self.assertGreater(figs[f"stage_{st['stage']}_peak_rss_bytes"], 10 << 20)
            self.assertIn(f"stage_{st['stage']}_ms", figs)
        self.check_reference(out, meta, max_new_tokens)
        return meta, tensors

    def check_reference(self, out, meta, max_new_tokens):
        if WORKER is None:
            print(f"\n  [skip] gatehouse-worker --check-reference {out.name}: no --worker given "
                  "or the file is missing", file=sys.stderr)
            return
        proc = subprocess.run([str(WORKER), "--check-reference", str(out)], capture_output=True,
                              text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        self.assertEqual(summary["max_new_tokens"], max_new_tokens)
        self.assertEqual(summary["format"], "gatehouse-reference/2")
        self.assertEqual(summary["training_steps"], 2)
        self.assertEqual(len(summary["prompt_lengths"]), meta["num_prompts"])

    # --- PASS: default prompts -------------------------------------------------------------

    def test_olmo2_default_prompts_with_tokenizer_and_chat(self):
        events, attempt, out = self.run_spec("olmo2")
        meta, tensors = self.assert_pass_bundle(events, attempt, out)
        self.assertEqual(meta["model_type"], "olmo2")
        self.assertTrue(meta["tokenizer"])
        tok = transformers.AutoTokenizer.from_pretrained(str(self.root / "olmo2"))
        whys = [c["why"] for c in meta["prompts_chosen"]]
        # short (text), chat, medium, far (cut to max_position_embeddings 256 - 4 new tokens);
        # no RoPE scaling, no window.
        self.assertEqual(len(whys), 4, whys)
        self.assertIn("far prompt: 252", whys[3])
        self.assertIn("short prompt", whys[0])
        self.assertEqual(tensors["prompts.0.input_ids"].tolist(),
                         tok(reference_cell.SHORT_PROMPT_TEXT)["input_ids"])
        self.assertIn("chat", whys[1])
        chat_ids = tok.apply_chat_template([{"role": "user", "content": reference_cell.CHAT_PROMPT_TEXT}],
                                           add_generation_prompt=True, tokenize=True)["input_ids"]
        self.assertEqual(tensors["prompts.1.input_ids"].tolist(), chat_ids)
        self.assertEqual(tensors["prompts.1.input_ids"][-1].item(), tok.convert_tokens_to_ids("<|assistant|>"))
        self.assertEqual(meta["prompts_omitted"], [])
        # The decode gate's text: the prompt and upstream's decoded fp32 continuation.
        self.assertEqual(len(meta["prompts"]), 4)
        self.assertEqual(meta["prompts"][0]["text"], reference_cell.SHORT_PROMPT_TEXT)
        self.assertTrue(meta["prompts"][1]["chat"])
        for i, p in enumerate(meta["prompts"]):
            self.assertEqual(p["greedy_text"], tok.decode(tensors[f"prompts.{i}.greedy_ids"].tolist()))

    def test_qwen2_sliding_window_gets_a_prompt_past_it(self):
        events, attempt, out = self.run_spec("qwen2")
        meta, tensors = self.assert_pass_bundle(events, attempt, out)
        self.assertFalse(meta["tokenizer"])
        self.assertNotIn("prompts", meta)  # no tokenizer, no text
        lengths = [c["length"] for c in meta["prompts_chosen"]]
        self.assertEqual(lengths, [7, 33, 40 + 16, 252])  # the far prompt, cut to 256 - 4
        self.assertIn("sliding_window 40", meta["prompts_chosen"][2]["why"])
        self.assertGreater(max(lengths), 40)
        ids = torch.cat([tensors[f"prompts.{i}.input_ids"] for i in range(3)])
        self.assertTrue(bool(((ids >= 3) & (ids < 256)).all()))

    def test_llama3_rope_gets_a_prompt_past_original_max_position_embeddings(self):
        events, attempt, out = self.run_spec("llama")
        meta, _ = self.assert_pass_bundle(events, attempt, out)
        lengths = [c["length"] for c in meta["prompts_chosen"]]
        self.assertEqual(lengths, [7, 33, 64 + 16, 300])  # and the far prompt
        self.assertIn("original_max_position_embeddings 64", meta["prompts_chosen"][2]["why"])

    # --- PASS: prompts given by the cell ---------------------------------------------------

    def test_explicit_prompts_ids_verbatim_text_and_chat(self):
        ids_a = [5, 17, 200, 3, 3, 99, 255, 0]
        ids_b = list(range(10, 60))
        prompts = [{"ids": ids_a}, {"text": "Hello world", "chat": False},
                   {"text": "What is the capital of France?", "chat": True}, {"ids": ids_b}]
        events, attempt, out = self.run_spec("olmo2", prompts=prompts)
        meta, tensors = self.assert_pass_bundle(events, attempt, out)
        self.assertEqual(meta["num_prompts"], 4)
        self.assertTrue(torch.equal(tensors["prompts.0.input_ids"], torch.tensor(ids_a, dtype=torch.int64)))
        self.assertTrue(torch.equal(tensors["prompts.3.input_ids"], torch.tensor(ids_b, dtype=torch.int64)))
        tok = transformers.AutoTokenizer.from_pretrained(str(self.root / "olmo2"))
        self.assertEqual(tensors["prompts.1.input_ids"].tolist(), tok("Hello world")["input_ids"])
        self.assertEqual(tensors["prompts.2.input_ids"].tolist(), tok.apply_chat_template(
            [{"role": "user", "content": "What is the capital of France?"}],
            add_generation_prompt=True, tokenize=True)["input_ids"])
        self.assertEqual(meta["prompts"][1]["text"], "Hello world")
        self.assertEqual(meta["prompts_omitted"], [])
        self.assertTrue(all("given by the cell" in c["why"] for c in meta["prompts_chosen"]))

    # --- BLOCKED / FAIL --------------------------------------------------------------------

    def assert_reference_not_pass(self, events, out, status, *needles):
        end = self.phase_end(events, "reference")
        self.assertEqual(end["status"], status, end)
        for needle in needles:
            self.assertIn(needle, end["reason"])
        self.assertEqual(events[-1]["status"], status)
        self.assertFalse(out.exists(), "no bundle after a failed run")
        self.assertEqual([p.name for p in out.parent.iterdir()], ["run.json"], "nothing half-written")
        self.assertFalse([e for e in events if e["event"] == "artifact"])
        return end

    def test_text_prompt_without_tokenizer_is_blocked(self):
        events, _, out = self.run_spec("llama", prompts=[{"ids": [5, 6, 7]},
                                                         {"text": "Hello", "chat": False}])
        self.assertEqual(self.phase_end(events, "identity")["status"], "PASS")
        self.assert_reference_not_pass(events, out, "BLOCKED", "prompt 1", "no usable tokenizer")

    def test_id_outside_vocabulary_is_blocked(self):
        events, _, out = self.run_spec("qwen2", prompts=[{"ids": [5, 6, 7]}, {"ids": [1, 256, 3]}])
        self.assert_reference_not_pass(events, out, "BLOCKED", "prompt 1", "[256]", "[0, 256)")

    def test_wrong_checkpoint_digest_blocks_identity(self):
        wrong = "sha256:" + "0" * 64
        events, _, out = self.run_spec("llama", digest=wrong)
        ident = self.phase_end(events, "identity")
        self.assertEqual(ident["status"], "BLOCKED")
        self.assertIn(wrong, ident["reason"])
        self.assertIn(reference_cell.directory_digest(self.root / "llama"), ident["reason"])
        ref = self.phase_end(events, "reference")
        self.assertEqual(ref["status"], "SKIPPED")
        self.assertIn("identity ended BLOCKED", ref["reason"])
        self.assertFalse([e for e in events if e["event"] == "phase_start" and e["phase"] == "reference"])
        self.assertEqual(events[-1]["status"], "BLOCKED")
        self.assertFalse(out.exists())

    def test_torch_pin_mismatch_blocks(self):
        events, _, out = self.run_spec("llama", torch_pin="0.0.1")
        ident = self.phase_end(events, "identity")
        self.assertEqual(ident["status"], "BLOCKED")
        self.assertIn("runtime pin torch 0.0.1", ident["reason"])
        self.assertIn(TORCH, ident["reason"])
        self.assertEqual(self.phase_end(events, "reference")["status"], "SKIPPED")
        self.assertEqual(events[-1]["status"], "BLOCKED")
        self.assertFalse(out.exists())

    def test_transformers_pin_mismatch_blocks(self):
        events, _, _ = self.run_spec("llama", transformers_pin="4.0.0")
        ident = self.phase_end(events, "identity")
        self.assertEqual(ident["status"], "BLOCKED")
        self.assertIn("runtime pin transformers 4.0.0", ident["reason"])

    def test_checkpoint_transformers_cannot_load_fails(self):
        events, _, out = self.run_spec("corrupt")
        end = self.assert_reference_not_pass(events, out, "FAIL", "transformers cannot load the checkpoint",
                                             "no_such_model")
        self.assertEqual(end["classification"], "unknown")

    def test_nonfinite_upstream_output_fails(self):
        events, _, out = self.run_spec("overflow")
        end = self.assert_reference_not_pass(events, out, "FAIL", "cannot be a reference",
                                             "prompts.0.logits holds")
        self.assertEqual(end["classification"], "unknown")

    # --- the digest is the C++ one ---------------------------------------------------------

    def test_directory_digest_matches_the_worker(self):
        """The identity gate of gatehouse-worker computes DirectoryDigest (common/sha256.h) in
        C++; here over a folder with a subfolder, a symlinked file and a symlinked folder."""
        if WORKER is None:
            self.skipTest("no --worker: the digest is not compared with the C++ one")
        d = self.root / "digest"
        (d / "sub" / "deeper").mkdir(parents=True)
        (self.root / "elsewhere").mkdir()
        (self.root / "elsewhere" / "t").write_text("target\n")
        (d / "a.txt").write_text("a\n")
        (d / "B").write_bytes(b"\x00\x01")
        (d / "sub" / "deeper" / "z").write_text("z" * 5000)
        (d / "link_file").symlink_to(self.root / "elsewhere" / "t")
        (d / "link_dir").symlink_to(self.root / "elsewhere")
        attempt = self.root / "digest-attempt"
        attempt.mkdir()
        zero = "sha256:" + "0" * 64
        spec = {"spec_version": 1, "repository": "/x", "commit": "0" * 40, "model_family": "llama",
                "checkpoint": {"path": str(d), "digest": zero},
                "reference": {"path": str(d), "digest": zero},
                "runtime": {"torch": TORCH, "device": "cpu"},
                "launch": {"runner": "gatehouse-worker", "processes_per_rank": 1},
                "topology": {"tp": 1, "dp": 1, "pp": 1, "ep": 1}, "precision": "fp32", "mode": "eager",
                "decode": {"max_new_tokens": 4, "sampling": "greedy"},
                "training": {"steps": 2, "lr": 0.001, "seed": 1234}, "env": {}, "phases": ["identity"],
                "attempt": {"id": 1, "dir": str(attempt),
                            "checkout": {"head": "0" * 40, "clean": True, "path": "/x"}, "agent": "t"}}
        (attempt / "run.json").write_text(json.dumps(spec))
        proc = subprocess.run([str(WORKER), "--run-spec", "run.json"], cwd=attempt,
                              capture_output=True, text=True, timeout=60)
        theirs = [json.loads(line)["value"] for line in proc.stdout.splitlines()
                  if '"checkpoint_digest"' in line]
        if not theirs:
            self.skipTest(f"gatehouse-worker printed no checkpoint_digest (its run spec format may "
                          f"have moved on; rc {proc.returncode}): {proc.stderr[-300:]}")
        self.assertEqual(reference_cell.directory_digest(d), theirs[0])


def main():
    global WORKER
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--worker", type=Path)
    args, rest = parser.parse_known_args()
    if args.worker is not None and args.worker.is_file() and os.access(args.worker, os.X_OK):
        WORKER = args.worker.resolve()
    elif args.worker is not None:
        print(f"--worker {args.worker} is missing: the --check-reference checks are skipped",
              file=sys.stderr)
    else:
        print("no --worker: the --check-reference checks are skipped", file=sys.stderr)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
