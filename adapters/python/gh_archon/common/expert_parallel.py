"""Expert parallelism as torchtitan's ExpertParallel style lays it out
(torchtitan/distributed/expert_parallel.py), for a GroupedExperts module whose forward takes
(rows grouped by expert, num_tokens_per_expert [E]):

* the stacked expert parameters become DTensors sharded over the experts (Shard(0)) on the
  1-D ``ep`` mesh: EP rank r holds experts [r E / ep, (r + 1) E / ep);
* dispatch (before the experts): the counts are exchanged all-to-all, then the rows, each to
  the rank holding its expert; the rows received (grouped by source rank, each source's rows
  by expert) are regrouped by local expert;
* combine (after the experts): the rows are put back in source order and sent back, so the
  MoE block gets its own rows in its own order.

The all-to-alls are differentiable (backward sends the row gradients back the same way), so an
expert's weight gradient holds every EP rank's tokens: no further reduction over the EP group.
Data-parallel ranks outside the EP group that hold the same experts (``expert_dp_mesh``, more
than one rank when ep is smaller than the data-parallel size) each hold their own tokens'
gradient: ``sum_expert_gradients`` adds them, in fp32."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class _AllToAllRows(torch.autograd.Function):
    """x [N, ...] -> [sum(recv), ...]: send[r] rows to rank r, recv[r] rows from it."""

    @staticmethod
    def forward(ctx, x, recv: list[int], send: list[int], group):
        ctx.recv, ctx.send, ctx.group = recv, send, group
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return out, None, None, None


class ExpertParallel:
    """Applies expert parallelism to one GroupedExperts module over ``ep_mesh`` (1-D). One
    instance per module: it keeps the splits of the current forward between dispatch and
    combine."""

    def __init__(self, ep_mesh):
        self.mesh = ep_mesh
        self._send = self._recv = self._order = None

    def apply(self, experts: nn.Module) -> nn.Module:
        from torch.distributed.tensor import Shard, distribute_tensor

        ep = self.mesh.size()
        if experts.num_experts % ep:
            raise ValueError(f"expert parallel size {ep} does not divide num_experts = "
                             f"{experts.num_experts}")
        for name, p in list(experts.named_parameters(recurse=False)):
            # Every rank loaded the whole checkpoint: each keeps its own chunk, no scatter.
            sharded = distribute_tensor(p.data, self.mesh, [Shard(0)], src_data_rank=None)
            experts.register_parameter(name, nn.Parameter(sharded, requires_grad=p.requires_grad))
        experts.register_forward_pre_hook(self._dispatch)
        experts.register_forward_hook(self._combine)
        return experts

    def _dispatch(self, module, inputs):
        rows, counts = inputs  # counts [E]: this rank's rows per expert, in expert order
        ep = self.mesh.size()
        local = counts.numel() // ep
        group = self.mesh.get_group()
        with torch.no_grad():
            counts_in = torch.empty_like(counts)
            # counts_in[s * local + e]: rank s's rows for this rank's local expert e.
            dist.all_to_all_single(counts_in, counts.contiguous(), group=group)
        self._send = counts.view(ep, local).sum(1).tolist()
        self._recv = counts_in.view(ep, local).sum(1).tolist()
        received = _AllToAllRows.apply(rows, self._recv, self._send, group)
        # Source-major (rank, expert) segments -> expert-major (expert, rank): each received
        # row's local expert, sorted stably (the ranks' order kept within an expert).
        expert_of_row = torch.repeat_interleave(
            torch.arange(ep * local, device=counts_in.device) % local, counts_in)
        self._order = torch.argsort(expert_of_row, stable=True)
        return received[self._order], counts_in.view(ep, local).sum(0)

    def _combine(self, module, inputs, out):
        source_major = out[torch.argsort(self._order)]
        send, recv = self._send, self._recv
        self._send = self._recv = self._order = None
        return _AllToAllRows.apply(source_major, send, recv, self.mesh.get_group())


def sum_expert_gradients(params: list[nn.Parameter], expert_dp_mesh) -> None:
    """After each backward accumulates an expert parameter's gradient, sums its local shard
    over ``expert_dp_mesh`` (the data-parallel ranks holding the same experts) in fp32: a
    replicated expert's gradient, as DDP reduces a replicated parameter. Nothing when that mesh
    has one rank."""
    if expert_dp_mesh is None or expert_dp_mesh.size() == 1:
        return
    group = expert_dp_mesh.get_group()

    def hook(p: torch.Tensor) -> None:
        local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        wide = local.float()
        dist.all_reduce(wide, group=group)
        local.copy_(wide)

    for p in params:
        p.register_post_accumulate_grad_hook(hook)


def expert_parallel_parameters(model: nn.Module) -> set[nn.Parameter]:
    """The parameters an ExpertParallel plan made DTensors over an "ep" mesh: a data-parallel
    wrapper leaves them to the plan (FSDP2's ``ignored_params``)."""
    from torch.distributed.tensor import DTensor

    return {p for p in model.parameters()
            if isinstance(p, DTensor) and "ep" in (p.device_mesh.mesh_dim_names or ())}
