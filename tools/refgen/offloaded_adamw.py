"""torch.optim.AdamW stepped one parameter at a time, with its state in files between steps.

What
    The reference runner's training traces (make_checkpoint.training_trace, envelope.py) run
    upstream's AdamW steps on the user's checkpoint. Held as torch.optim.AdamW holds it, the
    optimizer state (exp_avg and exp_avg_sq, two tensors of each parameter's shape) is two more
    copies of the model beside the model and its gradients: four times the checkpoint's bytes
    in fp32 before a single activation. OffloadedAdamW keeps each parameter's state in a file of
    a scratch directory between steps and steps the parameters one at a time, freeing each
    gradient once its parameter is updated, smallest parameters first (so the largest, often
    the tied embedding, steps when the other gradients are already gone). Peak memory is then
    the model, its gradients and one parameter's state.

Same numbers
    Each parameter is stepped by its own torch.optim.AdamW (same lr, betas, eps, weight_decay,
    torch's defaults otherwise) whose state is restored from the files: torch.optim.AdamW
    updates every parameter independently of the others (its single-tensor path, the default
    for CPU tensors; the foreach path computes the same per-element math over lists), so the
    parameters after each step are those one torch.optim.AdamW over all of them gives, bit for
    bit on the CPU (tests/reference/offloaded_adamw_test.py asserts it).

Files
    <scratch>/<index>.exp_avg and .exp_avg_sq: the raw bytes of the state tensor (contiguous,
    the parameter's dtype and shape), rewritten after each step. The caller owns the directory
    (a TemporaryDirectory beside the bundle being written: on disk, not in a tmpfs).
"""

from pathlib import Path

import numpy as np
import torch


class OffloadedAdamW:
    """AdamW over `params` (a list of leaf tensors) with its state in `scratch_dir`.

    step(after=None) updates every parameter that has a gradient and sets its .grad to None
    (as zero_grad(set_to_none=True) would before the next backward). after(i, param, before),
    when given, is called once parameter i (its index in `params`) is updated, with `before` a
    copy of its values before the update (one parameter's copy at a time)."""

    def __init__(self, params, scratch_dir, lr, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=1e-2):
        self.params = list(params)
        self.dir = Path(scratch_dir)
        self.hyper = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        self.state_steps = {}  # index -> the state's "step" tensor (a float32 scalar)

    def _path(self, i, name):
        return self.dir / f"{i}.{name}"

    def _load(self, i, name, like):
        raw = np.fromfile(self._path(i, name), dtype=np.uint8)
        return torch.from_numpy(raw).view(like.dtype).view(like.shape).to(like.device)

    def _save(self, i, name, tensor):
        tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tofile(self._path(i, name))

    def step(self, after=None):
        order = sorted(range(len(self.params)), key=lambda i: self.params[i].numel())
        for i in order:
            p = self.params[i]
            if p.grad is None:
                continue
            optimizer = torch.optim.AdamW([p], **self.hyper)
            if i in self.state_steps:
                optimizer.state[p] = {"step": self.state_steps[i],
                                      "exp_avg": self._load(i, "exp_avg", p),
                                      "exp_avg_sq": self._load(i, "exp_avg_sq", p)}
            before = p.detach().clone() if after is not None else None
            optimizer.step()
            state = optimizer.state.pop(p)
            self._save(i, "exp_avg", state["exp_avg"])
            self._save(i, "exp_avg_sq", state["exp_avg_sq"])
            self.state_steps[i] = state["step"]
            del optimizer, state
            p.grad = None
            if after is not None:
                after(i, p, before)
            del before
