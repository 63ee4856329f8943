#!/usr/bin/env python3
"""tools/bench/phase_accounting.py: a phase set beside transformers' same work, part by part,
and the why of a phase above the limit (issue 38: time to verdict you can account for)."""

import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "bench"))
import phase_accounting as pa  # noqa: E402


def phase(duration_ms, **figures):
    return {"duration_ms": duration_ms,
            "figures": [{"name": k, "value": v, "unit": "ms"} for k, v in figures.items()]}


# transformers' decode, 10.2 s of parts in a 10 s whole (the cases below vary ours).
DECODE_PEER = {"decode_s": 10.0, "forced_decode_s": 5.0, "comparison_s": 0.4,
               "greedy_decode_s": 4.8}


class DecodeTest(unittest.TestCase):
    def test_within_the_limit_has_no_why(self):
        acc = pa.account("decode", phase(11000, forced_decode_ms=5000, comparison_ms=500,
                                         greedy_decode_ms=5000, reference_read_ms=100),
                         {"decode_s": 10.0, "forced_decode_s": 4.8, "comparison_s": 0.4,
                          "greedy_decode_s": 4.8})
        self.assertAlmostEqual(acc["ratio"], 1.1)
        self.assertIsNone(acc["why"])
        self.assertAlmostEqual(acc["other_s"], 0.4)
        self.assertAlmostEqual(acc["same_work"]["ratio"], 10.5 / 10.0)
        read = [p for p in acc["parts"] if p["label"] == "reference bundle read"][0]
        self.assertFalse(read["both"])
        self.assertIsNone(read["theirs_s"])

    def test_above_the_limit_names_the_part_that_makes_the_difference(self):
        # The greedy decode is twice transformers'; everything else matches.
        acc = pa.account("decode", phase(15000, forced_decode_ms=5000, comparison_ms=400,
                                         greedy_decode_ms=9600),
                         DECODE_PEER)
        self.assertAlmostEqual(acc["ratio"], 1.5)
        self.assertIsNotNone(acc["why"])
        self.assertTrue(acc["why"].startswith("1.50x, 5.00 s more: +4.80 s free greedy decode"),
                        acc["why"])
        self.assertIn("2.00x", acc["why"])
        self.assertIn("the work both sides do: 15.00 s vs 10.20 s", acc["why"])

    def test_gate_only_work_is_named_as_such(self):
        acc = pa.account("decode", phase(14000, forced_decode_ms=5000, comparison_ms=400,
                                         greedy_decode_ms=4800, reference_read_ms=3800),
                         DECODE_PEER)
        self.assertIn("+3.80 s reference bundle read (gate only; 95 % of the difference)",
                      acc["why"])

    def test_untimed_rest_is_a_part_of_the_why(self):
        acc = pa.account("decode", phase(20000, forced_decode_ms=5000, comparison_ms=400,
                                         greedy_decode_ms=4800),
                         DECODE_PEER)
        self.assertAlmostEqual(acc["other_s"], 9.8)
        self.assertIn("untimed rest of the phase", acc["why"])

    def test_missing_sides_give_nothing(self):
        self.assertIsNone(pa.account("decode", phase(1000), None))
        self.assertIsNone(pa.account("decode", None, {"decode_s": 1.0}))
        self.assertIsNone(pa.account("inference", phase(1000), {"decode_s": 1.0}))


class TrainingTest(unittest.TestCase):
    def test_steps_are_split_into_their_parts(self):
        p = phase(30000, adopted_copy_ms=2000, fingerprint_ms=1000,
                  step_1_forward_backward_ms=8000, step_1_checks_ms=4000, step_1_optimizer_ms=2000,
                  step_2_forward_backward_ms=7000, step_2_checks_ms=1000, step_2_optimizer_ms=2000)
        peer = {"train_s": 20.0, "step_forward_backward_s": [7.5, 7.0],
                "step_optimizer_s": [2.5, 2.5], "train_cpu_share": 0.95}
        acc = pa.account("training", p, peer)
        labels = [x["label"] for x in acc["parts"]]
        self.assertEqual(labels[:6], ["step 1: forward + backward", "step 1: gradient checks",
                                      "step 1: optimizer", "step 2: forward + backward",
                                      "step 2: gradient checks", "step 2: optimizer"])
        self.assertAlmostEqual(acc["ratio"], 1.5)
        self.assertAlmostEqual(acc["same_work"]["ours_s"], 19.0)
        self.assertAlmostEqual(acc["same_work"]["theirs_s"], 19.5)
        self.assertAlmostEqual(acc["other_s"], 3.0)
        self.assertEqual(acc["peer_cpu_share"], 0.95)
        # The largest excess first: step 1's checks (4 s, gate only).
        self.assertIn("10.00 s more: +4.00 s step 1: gradient checks (gate only; 40 %", acc["why"])
        self.assertIn("(0.97x)", acc["why"])
        # Step 1's optimizer and both forwards are faster on ours: they take 1.0 s back.
        self.assertIn("parts where ours is faster: -1.00 s", acc["why"])

    def test_faster_shared_work_does_not_hide_gate_only_parts(self):
        # The 0.5B fp32 cell's shape: the shared steps are faster on ours, three gate-only parts
        # make the difference; each of them is named.
        p = phase(36600, fingerprint_ms=9100, step_1_forward_backward_ms=1800,
                  step_1_checks_ms=8600, step_1_optimizer_ms=7500, step_2_forward_backward_ms=1500,
                  step_2_checks_ms=5900, step_2_optimizer_ms=1000)
        peer = {"train_s": 19.3, "step_forward_backward_s": [1.6, 3.3],
                "step_optimizer_s": [12.8, 1.5]}
        acc = pa.account("training", p, peer)
        for part in ("weight fingerprints", "step 1: gradient checks", "step 2: gradient checks"):
            self.assertIn(part, acc["why"])
        self.assertIn("parts where ours is faster: -7.60 s", acc["why"])

    def test_no_faster_parts_say_nothing_of_them(self):
        acc = pa.account("decode", phase(15000, forced_decode_ms=5000, comparison_ms=400,
                                         greedy_decode_ms=9600),
                         DECODE_PEER)
        self.assertNotIn("faster", acc["why"])


class FigureNamesTest(unittest.TestCase):
    def test_every_gate_figure_is_one_a_gate_reports(self):
        # A renamed figure would leave its part silently out of the accounting: each name must
        # be a string literal in the gates' sources (the per-step ones by their suffix).
        src = Path(__file__).resolve().parents[2] / "worker_lib" / "src"
        text = "".join(f.read_text() for f in sorted(src.glob("gates_*.cc")))
        names = [fig for _, _, parts in pa.PARTS.values() for _, fig, _ in parts]
        names += ["_forward_backward_ms", "_checks_ms", "_optimizer_ms"]
        for name in names:
            self.assertIn(f'"{name}"', text, name)


if __name__ == "__main__":
    unittest.main()
