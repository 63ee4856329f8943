#!/usr/bin/env python3
"""The reference runner's low-memory training trace computes what torch.optim.AdamW computes.

tools/refgen/offloaded_adamw.py steps torch.optim.AdamW one parameter slice at a time with its
state in files, after the backward or inside it, and make_checkpoint.training_trace uses it
inside the backward (with step-1 gradients and first-change steps read per parameter and named
by checkpoint key through make_checkpoint.checkpoint_slices). Checked here on checkpoints
transformers saves in the test (a tied Llama and a Qwen3-MoE, whose experts are fused in
memory and split by key on save), in fp32 and bf16:
  - OffloadedAdamW against one torch.optim.AdamW over all parameters: every parameter equal
    bit for bit after each of 3 steps, stepped after the backward and inside it, in slices of
    37 elements (odd, so slices start at every alignment) and whole;
  - checkpoint_slices of every parameter against one save_pretrained: the same keys and values;
  - envelope.packing_figures, which keeps the unpacked batch's gradients in files, against the
    same figures from gradients held in memory: the same gradient spread and worst key;
  - training_trace against the trace as torch.optim.AdamW over the whole model makes it (the
    definition in the module docstring of make_checkpoint.py): losses, step-1 gradient norms
    and sums per key, and first-change steps, all equal;
  - the state files: two per parameter with a gradient, each of the parameter's bytes, gone
    with the scratch directory's temporary folder when the trace ends.
Exit 0 when all hold; prints each check.
"""

import sys
import tempfile
from pathlib import Path

import torch
import transformers
from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "refgen"))
import envelope  # noqa: E402
import make_checkpoint  # noqa: E402
from memory import float64_norm_and_sum  # noqa: E402
from offloaded_adamw import OffloadedAdamW  # noqa: E402

FAILED = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        FAILED.append(what)


def tiny_models(root):
    """{name: checkpoint dir} of two random models saved by transformers."""
    torch.manual_seed(0)
    common = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
    out = {}
    for name, config, cls in (
            ("llama_tied", transformers.LlamaConfig(**common, tie_word_embeddings=True),
             transformers.LlamaForCausalLM),
            ("qwen3_moe", transformers.Qwen3MoeConfig(**common, num_experts=4,
                                                      num_experts_per_tok=2,
                                                      moe_intermediate_size=16),
             transformers.Qwen3MoeForCausalLM)):
        model = cls(config)
        d = root / name
        model.save_pretrained(str(d))
        out[name] = (d, cls)
    return out


def prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, 96, (n,), generator=g) for n in (9, 14, 5)]


def saved_tensors(model, data=None):
    """The model's tensors as upstream's own save path names them (fused tensors split back
    into checkpoint keys, tied aliases left out): (key, tensor) pairs from one save_pretrained.
    data(param) -> tensor, when given, is saved in place of each parameter's values."""
    params = list(model.parameters())
    saved = [p.data for p in params]
    with tempfile.TemporaryDirectory(prefix="saved-") as tmp:
        try:
            if data is not None:
                for p in params:
                    p.data = data(p)
            model.save_pretrained(tmp, safe_serialization=True)
        finally:
            for p, d in zip(params, saved):
                p.data = d
        out = []
        for f in sorted(Path(tmp).glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as handle:
                out.extend((key, handle.get_tensor(key)) for key in handle.keys())
        return out


def whole_model_trace(checkpoint, cls, batches, dtype, steps, lr):
    """The trace by its definition: torch.optim.AdamW over every parameter, gradients and
    first-change steps read from one save of the whole model."""
    model = cls.from_pretrained(str(checkpoint), dtype=dtype, attn_implementation="eager")
    model.train()
    torch.manual_seed(make_checkpoint.TRAIN_SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    params = list(model.parameters())
    initial = [p.detach().clone() for p in params]
    first = [torch.zeros(p.shape, dtype=torch.int32) for p in params]
    losses, norms, sums = [], {}, {}
    usable = [p for p in batches if p.numel() >= 2]
    for step in range(1, steps + 1):
        ids = usable[(step - 1) % len(usable)]
        optimizer.zero_grad()
        logits = model(input_ids=ids[:-1].unsqueeze(0)).logits.to(torch.float32)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), ids[1:])
        loss.backward()
        losses.append(loss.item())
        if step == 1:
            for key, g in saved_tensors(model, data=lambda p: p.grad):
                norms[key] = g.to(torch.float64).norm().item()
                sums[key] = g.to(torch.float64).sum().item()
        optimizer.step()
        with torch.no_grad():
            for p, p0, f in zip(params, initial, first):
                f.masked_fill_((f == 0) & (p != p0), step)
    index = {id(p): f for p, f in zip(params, first)}
    changed = {}
    for key, f in saved_tensors(model, data=lambda p: index[id(p)].float()):
        c = f[f > 0]
        changed[key] = int(c.min().item()) if c.numel() else None
    return losses, norms, sums, changed


def check_optimizer(name, checkpoint, cls, dtype, scratch, in_backward, slice_elements):
    how = (f"{'inside' if in_backward else 'after'} the backward, slices of "
           f"{slice_elements if slice_elements else 'whole parameters'}")
    a = cls.from_pretrained(str(checkpoint), dtype=dtype, attn_implementation="eager").train()
    b = cls.from_pretrained(str(checkpoint), dtype=dtype, attn_implementation="eager").train()
    whole = torch.optim.AdamW(a.parameters(), lr=1e-2)
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        kw = {"slice_elements": slice_elements} if slice_elements else {}
        offloaded = OffloadedAdamW(b.parameters(), tmp, lr=1e-2, **kw)
        usable = prompts()
        equal_steps = 0
        for step in range(3):
            ids = usable[step % len(usable)]
            for model in (a, b):
                logits = model(input_ids=ids[:-1].unsqueeze(0)).logits.float()
                loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)),
                                                         ids[1:])
                if model is b and in_backward:
                    with offloaded.in_backward():
                        loss.backward()
                else:
                    loss.backward()
            whole.step()
            whole.zero_grad()
            if not in_backward:
                offloaded.step()
            equal_steps += all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
        files = sorted(Path(tmp).iterdir())
        with_grad = len(offloaded.state_steps)
        sizes_ok = all(
            (Path(tmp) / f"{i}.{s}").stat().st_size == p.numel() * p.element_size()
            for i, p in enumerate(offloaded.params) if i in offloaded.state_steps
            for s in ("exp_avg", "exp_avg_sq"))
    check(equal_steps == 3, f"{name} {dtype} {how}: OffloadedAdamW equals torch.optim.AdamW bit "
                            f"for bit after each of 3 steps ({equal_steps}/3)")
    check(len(files) == 2 * with_grad and sizes_ok,
          f"{name} {dtype} {how}: {len(files)} state files for {with_grad} parameters, each of "
          f"the parameter's bytes")
    check(all(p.grad is None for p in b.parameters()),
          f"{name} {dtype} {how}: every gradient freed by the step")


def check_slices(name, checkpoint, cls):
    model = cls.from_pretrained(str(checkpoint), dtype=torch.float32)
    got = {}
    for pname, p in model.named_parameters():
        for key, t in make_checkpoint.checkpoint_slices(model, pname, p.detach()):
            got.setdefault(key, []).append(t)
    want = dict(saved_tensors(model))
    same = (sorted(got) == sorted(want) and all(len(v) == 1 for v in got.values())
            and all(torch.equal(got[k][0], want[k]) for k in want))
    check(same, f"{name}: checkpoint_slices names {len(got)} keys, save_pretrained {len(want)}; "
                f"same keys and values")


def packing_in_memory(model, prompts):
    """packing_figures' gradient spread as its definition computes it: the unpacked batch's
    gradients accumulated in .grad over one backward per sequence, then the packed step's
    subtracted in place; (largest ||unpacked - packed|| / ||unpacked||, its parameter)."""
    usable = [p for p in prompts if p.numel() >= 2]
    inputs, labels = [p[:-1] for p in usable], [p[1:] for p in usable]
    predicted = sum(y.numel() for y in labels)
    model.train()
    for x, y in zip(inputs, labels):
        logits = model(input_ids=x.unsqueeze(0), use_cache=False).logits[0]
        (torch.nn.functional.cross_entropy(logits.float(), y, reduction="sum")
         / predicted).backward()
    norms = {n: float64_norm_and_sum(p.grad)[0] for n, p in model.named_parameters()}
    row, positions, _ = envelope._packed_inputs(inputs, "cpu")
    logits = model(input_ids=row, position_ids=positions, use_cache=False).logits[0]
    (-torch.nn.functional.cross_entropy(logits.float(), torch.cat(labels))).backward()
    worst, key = 0.0, ""
    for n, p in model.named_parameters():
        rel = float64_norm_and_sum(p.grad)[0] / norms[n]
        if rel > worst or not key:
            worst, key = rel, n
        p.grad = None
    model.eval()
    return worst, key


def check_packing(name, checkpoint, cls, scratch):
    model = cls.from_pretrained(str(checkpoint), dtype=torch.float32,
                                attn_implementation="eager").eval()
    batch = prompts()
    with torch.no_grad():
        alone = [model(input_ids=p.unsqueeze(0)).logits[0].float() for p in batch]
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        got = envelope.packing_figures(model, batch, alone, tmp)
        left = list(Path(tmp).iterdir())
    want = packing_in_memory(model, batch)
    check((got["grad_rel"], got["grad_rel_key"]) == want and not left,
          f"{name}: packing's gradient spread from files {got['grad_rel']:.6g} "
          f"({got['grad_rel_key']}) equals the in-memory one {want[0]:.6g} ({want[1]}); "
          f"{len(left)} file(s) left")


def main():
    with tempfile.TemporaryDirectory(prefix="offloaded-adamw-") as tmp:
        root = Path(tmp)
        for name, (checkpoint, cls) in tiny_models(root).items():
            check_slices(name, checkpoint, cls)
            check_packing(name, checkpoint, cls, root)
            for dtype in (torch.float32, torch.bfloat16):
                for in_backward, slice_elements in ((False, None), (True, 37), (False, 37)):
                    check_optimizer(name, checkpoint, cls, dtype, root, in_backward,
                                    slice_elements)
                want = whole_model_trace(checkpoint, cls, prompts(), dtype, 4, 1e-3)
                scratch = root / f"scratch-{name}"
                scratch.mkdir(exist_ok=True)
                got = make_checkpoint.training_trace(checkpoint, cls, prompts(), dtype, 4, 1e-3,
                                                     scratch_dir=scratch)
                check(got["losses"] == want[0], f"{name} {dtype}: losses equal {got['losses']}")
                check(got["grad_norms"] == want[1] and got["grad_sums"] == want[2],
                      f"{name} {dtype}: step-1 gradient norms and sums equal on all "
                      f"{len(want[1])} keys")
                check(got["first_changed_step"] == want[3],
                      f"{name} {dtype}: first-change steps equal on all {len(want[3])} keys")
                check(not any(scratch.iterdir()), f"{name} {dtype}: no state file left behind")
    print(f"{len(FAILED)} failed" if FAILED else "all passed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
