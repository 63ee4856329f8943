"""Where a gate's time went, against transformers doing the same work.

tools/bench/real_size.py runs a validation cell and, in the same run, real_size_peer.py's
modes that do each gate's work with transformers (decode, packing, logprob, train). Each
gate times its parts as evidence figures (`*_ms`); each peer mode times the same parts
(`*_s`). account() sets them side by side:

- the gate's phase duration against the peer's whole work (the ratio);
- each part's time on both sides, or on ours alone where only the gate does that work (its
  checks, the bundle read, the copy of adopted parameters);
- "other": the phase duration less its timed parts (setup, events, what no figure times);
- when the ratio is above LIMIT, a why: the parts that make up the difference, largest first,
  each with its share of it, and whether the parts both sides do are themselves slower.

Nothing here measures; it reads the figures the two sides wrote.
"""

# Above this ratio a phase must say why (issue 38: "any phase slower than 1.2x its transformers
# counterpart says why").
LIMIT = 1.2

# Per phase: the peer mode, the peer's whole-work key, and the parts as
# (label, the gate's figure in ms, the peer's key in seconds or None where only the gate does it).
PARTS = {
    "decode": ("decode", "decode_s", [
        ("forced decode (KV cache, along upstream's greedy ids)", "forced_decode_ms", "forced_decode_s"),
        ("comparisons with the bundle's logits", "comparison_ms", "comparison_s"),
        ("free greedy decode", "greedy_decode_ms", "greedy_decode_s"),
        ("reference bundle read", "reference_read_ms", None),
    ]),
    "packing": ("packing", "packing_s", [
        ("packed forward", "packed_forward_ms", "packed_forward_s"),
        ("forwards alone", "alone_forwards_ms", "alone_forwards_s"),
        ("logit comparison", "logit_comparison_ms", "logit_comparison_s"),
        ("unpacked backward", "unpacked_step_ms", "unpacked_step_s"),
        ("packed forward + backward", "packed_step_ms", "packed_step_s"),
        ("gradient comparison (float64)", "gradient_comparison_ms", "gradient_comparison_s"),
        ("reference bundle read", "reference_read_ms", None),
    ]),
    "logprob_parity": ("logprob", "logprob_s", [
        ("rollout (sampled, KV cache)", "rollout_ms", "rollout_s"),
        ("forced decode along upstream's greedy ids", "forced_decode_ms", "forced_decode_s"),
        ("packed train-mode forward", "training_forward_ms", "training_forward_s"),
        ("reference bundle read", "reference_read_ms", None),
    ]),
    # The training parts per step are added by training_parts().
    "training": ("train", "train_s", [
        ("copy of adopted parameters", "adopted_copy_ms", None),
        ("weight fingerprints (before and after)", "fingerprint_ms", None),
        ("reference bundle read", "reference_read_ms", None),
    ]),
}


def figures_of(phase):
    """{name: value} of a phase's evidence figures (the cell JSON's phase object)."""
    return {f.get("name"): f.get("value") for f in (phase or {}).get("figures", []) or []}


def training_parts(figs, peer):
    """The training gate's per-step parts: forward + backward and the optimizer on both sides,
    the gradient checks on ours alone."""
    parts = []
    steps = len(peer.get("step_forward_backward_s") or [])
    k = 1
    while f"step_{k}_forward_backward_ms" in figs or k <= steps:
        i = k - 1
        fb = peer.get("step_forward_backward_s") or []
        opt = peer.get("step_optimizer_s") or []
        parts.append((f"step {k}: forward + backward", f"step_{k}_forward_backward_ms",
                      fb[i] if i < len(fb) else None, True))
        parts.append((f"step {k}: gradient checks", f"step_{k}_checks_ms", None, False))
        parts.append((f"step {k}: optimizer", f"step_{k}_optimizer_ms",
                      opt[i] if i < len(opt) else None, True))
        k += 1
    return parts


def account(name, phase, peer):
    """One phase against the peer's same work.

    phase: the cell JSON's phase object (duration_ms, figures); peer: the peer mode's JSON (or
    None). Returns a dict: phase, ours_s, theirs_s, ratio, parts [{label, ours_s, theirs_s,
    excess_s}], other_s, same_work {ours_s, theirs_s, ratio} (the parts both sides do), why
    (text, or None when the ratio is within LIMIT or cannot be computed)."""
    if name not in PARTS or not phase or phase.get("duration_ms") is None or not peer:
        return None
    mode, total_key, fixed = PARTS[name]
    figs = figures_of(phase)
    ours = phase["duration_ms"] / 1000.0
    theirs = peer.get(total_key)
    parts = []
    rows = [(label, fig, peer.get(key) if key else None, key is not None) for label, fig, key in fixed]
    if name == "training":
        rows = training_parts(figs, peer) + rows
    for label, fig, their_s, both in rows:
        v = figs.get(fig)
        ours_s = v / 1000.0 if isinstance(v, (int, float)) else None
        if ours_s is None and their_s is None:
            continue
        excess = None
        if ours_s is not None:
            excess = ours_s - (their_s if (both and their_s is not None) else 0.0)
        parts.append({"label": label, "ours_s": ours_s, "theirs_s": their_s if both else None,
                      "both": both, "excess_s": excess})
    timed = sum(p["ours_s"] for p in parts if p["ours_s"] is not None)
    other = ours - timed
    both_ours = sum(p["ours_s"] for p in parts if p["both"] and p["ours_s"] is not None
                    and p["theirs_s"] is not None)
    both_theirs = sum(p["theirs_s"] for p in parts if p["both"] and p["ours_s"] is not None
                      and p["theirs_s"] is not None)
    r = ours / theirs if theirs else None
    out = {"phase": name, "peer_mode": mode, "ours_s": ours, "theirs_s": theirs, "ratio": r,
           "parts": parts, "other_s": other,
           "same_work": {"ours_s": both_ours, "theirs_s": both_theirs,
                         "ratio": both_ours / both_theirs if both_theirs else None},
           "peer_cpu_share": peer.get("cpu_share", peer.get("train_cpu_share")),
           "why": None}
    if r is not None and r > LIMIT:
        out["why"] = why(out)
    return out


def why(acc):
    """The difference (ours - theirs) in parts, largest first: each part's excess and its share
    of the difference, a gate-only part named as such; then what the parts where ours is faster
    take back, and the same-work ratio."""
    diff = acc["ours_s"] - acc["theirs_s"]
    items = [(p["excess_s"], p) for p in acc["parts"] if p["excess_s"] is not None and p["excess_s"] > 0]
    if acc["other_s"] > 0:
        items.append((acc["other_s"], {"label": "untimed rest of the phase", "both": False,
                                       "ours_s": acc["other_s"], "theirs_s": None}))
    items.sort(key=lambda x: -x[0])
    # Named until they cover 90 % of the excess (the positive parts), not of the difference:
    # where parts of ours are faster, the excess is larger than the difference.
    excess_total = sum(e for e, _ in items)
    said, covered = [], 0.0
    for excess, p in items:
        if covered >= 0.9 * excess_total and len(said) >= 1:
            break
        share = 100.0 * excess / diff if diff > 0 else 0.0
        if p["both"] and p.get("theirs_s"):
            detail = f"{p['ours_s']:.2f} s vs {p['theirs_s']:.2f} s, {p['ours_s'] / p['theirs_s']:.2f}x"
        else:
            detail = "gate only"
        said.append(f"+{excess:.2f} s {p['label']} ({detail}; {share:.0f} % of the difference)")
        covered += excess
    # Parts where ours is the faster side pay for part of the gate-only work: without them the
    # shares above would add up to 100 %; with them they add up to more.
    faster = sum(p["excess_s"] for p in acc["parts"] if p["excess_s"] is not None and p["excess_s"] < 0)
    sw = acc["same_work"]
    tail = f"; parts where ours is faster: {faster:.2f} s" if faster < 0 else ""
    if sw["ratio"] is not None:
        tail += (f"; the work both sides do: {sw['ours_s']:.2f} s vs {sw['theirs_s']:.2f} s "
                 f"({sw['ratio']:.2f}x)")
    return f"{acc['ratio']:.2f}x, {diff:.2f} s more: " + ", ".join(said) + tail
