"""torch.optim.AdamW stepped one parameter, and one slice of it, at a time, with its state in
files between steps, optionally inside the backward.

What
    The reference runner's training traces (make_checkpoint.training_trace, envelope.py) run
    upstream's AdamW steps on the user's checkpoint. Held as torch.optim.AdamW holds it, the
    optimizer state (exp_avg and exp_avg_sq, two tensors of each parameter's shape) is two more
    copies of the model beside the model and its gradients: four times the checkpoint's bytes
    in fp32 before a single activation. OffloadedAdamW keeps each parameter's state in a file of
    a scratch directory between steps and updates a parameter slice by slice (SLICE_ELEMENTS
    contiguous elements: the state, the update's temporaries and the copy `after` compares
    with are one slice's), freeing the gradient once its parameter is updated.

    in_backward() goes further: each parameter is updated by a post-accumulate-grad hook as
    soon as its gradient is complete (the optimizer-in-backward pattern of PyTorch's tutorials
    and torchtitan), so no gradient outlives its update and the trace never holds a whole set
    of gradients. Only the tied embedding's gradient, summed from the head's and the lookup's
    contributions, lives from the head's backward to the end.

Same numbers
    Each slice is stepped by its own torch.optim.AdamW (same lr, betas, eps, weight_decay,
    torch's defaults otherwise) whose state is restored from the files: AdamW's update is
    elementwise (its single-tensor path, the default for CPU tensors; the foreach path computes
    the same per-element math over lists), so the parameters after each step are those one
    torch.optim.AdamW over all of them gives, bit for bit on the CPU, whether stepped after the
    backward or inside it (a parameter's hook runs once every use of it in the graph has
    produced its gradient, so no later backward node reads the updated values).
    tests/reference/offloaded_adamw_test.py asserts both.

Files
    <scratch>/<index>.exp_avg and .exp_avg_sq: the raw bytes of the state tensor (contiguous,
    the parameter's dtype and shape), each slice rewritten in place after each step. The
    caller owns the directory (a TemporaryDirectory beside the bundle being written: on disk,
    not in a tmpfs).
"""

import contextlib
from pathlib import Path

import torch

# Elements per slice of one update: 16 Mi (64 MiB of fp32 state per moment).
SLICE_ELEMENTS = 1 << 24


class OffloadedAdamW:
    """AdamW over `params` (a list of leaf tensors) with its state in `scratch_dir`.

    step(after=None) updates every parameter that has a gradient and sets its .grad to None
    (as zero_grad(set_to_none=True) would before the next backward); step_one(i, after) updates
    parameter i alone. after(i, param, changed), when given, is called once parameter i (its
    index in `params`) is updated, with `changed` a bool tensor of its shape: which elements
    this step changed. slice_elements: the update's slice (tests use small ones)."""

    def __init__(self, params, scratch_dir, lr, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=1e-2, slice_elements=SLICE_ELEMENTS):
        self.params = list(params)
        self.dir = Path(scratch_dir)
        self.hyper = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        self.slice_elements = slice_elements
        self.state_steps = {}  # index -> the state's "step" tensor (a float32 scalar)

    def _path(self, i, name):
        return self.dir / f"{i}.{name}"

    def _read(self, f, like, lo, hi):
        """Elements [lo, hi) of a state file as a tensor of like's dtype, on like's device."""
        out = torch.empty(hi - lo, dtype=like.dtype)
        f.seek(lo * out.element_size())
        raw = out.view(torch.uint8).numpy()
        if f.readinto(memoryview(raw)) != raw.nbytes:
            raise RuntimeError(f"{f.name}: short read of elements [{lo}, {hi})")
        return out.to(like.device)

    @staticmethod
    def _write(f, tensor, lo):
        f.seek(lo * tensor.element_size())
        f.write(memoryview(tensor.detach().contiguous().cpu().view(torch.uint8).numpy()))

    def step_one(self, i, after=None):
        """Updates parameter i from its .grad (no-op without one) and frees the gradient."""
        p = self.params[i]
        if p.grad is None:
            return
        flat_p = p.detach().view(-1)  # parameters are contiguous (from_pretrained's, nn's)
        flat_g = p.grad.detach().reshape(-1)
        changed = torch.zeros(p.shape, dtype=torch.bool) if after is not None else None
        flat_changed = changed.view(-1) if changed is not None else None
        resumed = i in self.state_steps
        step_tensor = None
        mode = "r+b" if resumed else "w+b"
        with open(self._path(i, "exp_avg"), mode) as fa, open(self._path(i, "exp_avg_sq"),
                                                                 mode) as fs:
            for lo in range(0, flat_p.numel(), self.slice_elements):
                hi = min(lo + self.slice_elements, flat_p.numel())
                q = flat_p[lo:hi]
                q.grad = flat_g[lo:hi]
                optimizer = torch.optim.AdamW([q], **self.hyper)
                if resumed:
                    optimizer.state[q] = {"step": self.state_steps[i].clone(),
                                          "exp_avg": self._read(fa, q, lo, hi),
                                          "exp_avg_sq": self._read(fs, q, lo, hi)}
                before = q.clone() if changed is not None else None
                optimizer.step()
                if changed is not None:
                    flat_changed[lo:hi] = (q != before).cpu()
                state = optimizer.state.pop(q)
                self._write(fa, state["exp_avg"], lo)
                self._write(fs, state["exp_avg_sq"], lo)
                step_tensor = state["step"]
                q.grad = None
                del optimizer, state, before, q
        self.state_steps[i] = step_tensor
        p.grad = None
        del flat_g
        if after is not None:
            after(i, p, changed)

    def step(self, after=None):
        """Updates every parameter with a gradient, smallest first (the largest, often the
        tied embedding, steps when the other gradients are already gone)."""
        order = sorted(range(len(self.params)), key=lambda i: self.params[i].numel())
        for i in order:
            self.step_one(i, after)

    @contextlib.contextmanager
    def in_backward(self, before_step=None, after=None):
        """Within the block, every backward updates each parameter as soon as its gradient is
        complete (post-accumulate-grad hooks, removed on exit). before_step(i, param), when
        given, sees the complete gradient first (param.grad); after as in step()."""
        index = {id(p): i for i, p in enumerate(self.params)}

        def hook(p):
            i = index[id(p)]
            if before_step is not None:
                before_step(i, p)
            self.step_one(i, after)

        with post_accumulate_grad(self.params, hook):
            yield self


@contextlib.contextmanager
def post_accumulate_grad(params, hook):
    """hook(param) runs as each of `params` (those that require grad) has its gradient
    complete in any backward within the block (torch's post-accumulate-grad hooks, removed on
    exit)."""
    handles = [p.register_post_accumulate_grad_hook(hook) for p in params if p.requires_grad]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
