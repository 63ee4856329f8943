#!/usr/bin/env python3
"""tools/bench/real_size_peer.py's decode, packing and logprob modes do the gates' work: run on a
checkpoint and bundle the testdata fixture made (transformers' save_pretrained, the reference
bundle refgen wrote), each must reproduce a figure the bundle or the model fixes, so a peer that
silently did other work (a wrong cache, packed sequences attending across each other, a missed
prompt) fails here instead of giving real_size.py a wrong comparison.

Usage: real_size_peer_test.py --testdata DIR [--variant llama-tiny-untied]
"""

import argparse
import json
import subprocess
import sys
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEER = ROOT / "tools" / "bench" / "real_size_peer.py"
sys.path.insert(0, str(ROOT / "tools" / "bench"))
import phase_accounting as pa  # noqa: E402

ARGS = None


def assert_accounted_keys(test, phase, out):
    """Every key phase_accounting.py reads for `phase` is in the mode's output (a renamed key
    would leave that part without transformers' side, and nothing else would notice)."""
    _, total, parts = pa.PARTS[phase]
    test.assertIn(total, out)
    for label, _, key in parts:
        if key is not None:
            test.assertIn(key, out, label)


def peer(mode, *extra):
    fixture = Path(ARGS.testdata) / ARGS.variant
    cmd = [sys.executable, str(PEER), mode, "--checkpoint", str(fixture / "checkpoint"),
           "--bundle", str(fixture / "reference"), "--threads", "1", "--attn", "eager", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def bundle_meta():
    return json.loads((Path(ARGS.testdata) / ARGS.variant / "reference" / "reference.json").read_text())


class PeerModesTest(unittest.TestCase):
    def test_decode_reproduces_the_bundles_greedy_ids_and_logits(self):
        n = bundle_meta()["max_new_tokens"]
        out = peer("decode", "--max-new-tokens", str(n))
        assert_accounted_keys(self, "decode", out)
        self.assertEqual(out["greedy_total"], out["prompts"] * n)
        self.assertGreater(out["prompts"], 0)
        # Same checkpoint, same eager attention, fp32: transformers' own greedy decode again.
        self.assertEqual(out["greedy_matched"], out["greedy_total"])
        self.assertLess(out["steps_vs_bundle_max_abs_diff"], 1e-3)
        parts = out["forced_decode_s"] + out["comparison_s"] + out["greedy_decode_s"]
        self.assertLessEqual(parts, out["decode_s"] + 1e-6)
        self.assertGreater(out["forced_decode_s"], 0)

    def test_packing_keeps_sequences_apart(self):
        out = peer("packing")
        assert_accounted_keys(self, "packing", out)
        self.assertGreater(out["sequences"], 1)
        # Positions restarting per sequence: transformers masks them apart, so each packed
        # sequence's logits are its own forward's (a leak would be of the logits' own size).
        self.assertLess(out["packed_vs_alone_max_abs_diff"], 1e-3)
        # The unpacked and packed steps compute the same mean loss: gradients agree.
        self.assertLess(out["grad_rel_diff_max"], 1e-3)
        for key in ("packed_forward_s", "alone_forwards_s", "logit_comparison_s",
                    "unpacked_step_s", "packed_step_s", "gradient_comparison_s"):
            self.assertGreaterEqual(out[key], 0, key)
        self.assertLessEqual(out["packed_forward_s"] + out["unpacked_step_s"] + out["packed_step_s"],
                             out["packing_s"] + 1e-6)

    def test_logprob_scores_its_own_rollout_again(self):
        out = peer("logprob", "--max-new-tokens", "8", "--seed", "1234")
        assert_accounted_keys(self, "logprob_parity", out)
        self.assertEqual(out["sampled_tokens"], out["prompts"] * 8)
        # The rollout's log-probs against the packed train-mode forward's, same model, fp32:
        # equal up to the kernels' rounding.
        self.assertLess(out["max_abs_diff"], 1e-3)
        # The seed fixes the draws, and another seed draws others.
        again = peer("logprob", "--max-new-tokens", "8", "--seed", "1234")
        self.assertEqual(again["rollout_logprob_mean"], out["rollout_logprob_mean"])
        other = peer("logprob", "--max-new-tokens", "8", "--seed", "99")
        self.assertNotEqual(other["rollout_logprob_mean"], out["rollout_logprob_mean"])


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--testdata", required=True)
    ap.add_argument("--variant", default="llama-tiny-untied")
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)
