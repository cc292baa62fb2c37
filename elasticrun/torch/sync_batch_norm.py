"""Batch normalization over the samples of all ranks (horovod.torch's SyncBatchNorm).

In training with more than one rank, the batch mean and variance are those of every rank's
samples together (ranks may hold different numbers of samples, none included), the running
statistics move towards them as BatchNorm's would, and the backward pass reduces the two
sums the input gradient needs over all ranks. A rank's weight and bias gradients are its
own share, as in Horovod: the optimizer's allreduce sums them. In eval mode, or alone, it
is plain batch norm.

torch's fused kernels for this (`torch.batch_norm_stats`, `batch_norm_elemt`,
`batch_norm_backward_reduce`, ...) exist only for GPUs (torch 2.13 has no CPU kernel), so
the statistics are computed here with plain tensor ops, on any device.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import Function, once_differentiable
from torch.nn.modules.batchnorm import _BatchNorm

from elasticrun.torch.world import plane, runtime
from elasticrun.torch.world.boundary import collective


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half-precision inputs are normalised in float32, as torch's batch norm does.
    return torch.promote_types(dtype, torch.float32)


class SyncBatchNorm(_BatchNorm):
    """Applies batch normalization over the batches of all ranks together.

    Arguments as `torch.nn.BatchNorm2d`; takes inputs of shape (N, C, ...) of any rank
    from 2 on. Every rank must call it in training mode the same number of times (each
    forward and each backward is a collective)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalizes `input`: in training, with the statistics of every rank's batch
        together; in eval, as BatchNorm does."""
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            assert self.num_batches_tracked is not None
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)
        # Batch statistics in training, and in eval when there are no running statistics.
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        track = not self.training or self.track_running_stats
        running_mean = self.running_mean if track else None
        running_var = self.running_var if track else None
        if self.training:
            slot = runtime.current().slot
            if slot.size > 1:
                output: torch.Tensor = _SyncBatchNormFunction.apply(
                    input, self.weight, self.bias, running_mean, running_var, self.eps, factor,
                    slot.rank, slot.size)
                return output
        # Eval mode never synchronises: ranks may evaluate different numbers of batches.
        return F.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                            bn_training, factor, self.eps)


def _channel_view(values: torch.Tensor, dims: int) -> torch.Tensor:
    return values.view([1, -1] + [1] * (dims - 2))


class _SyncBatchNormFunction(Function):
    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, weight: torch.Tensor | None,
                bias: torch.Tensor | None, running_mean: torch.Tensor | None,
                running_var: torch.Tensor | None, eps: float, momentum: float, rank: int,
                size: int) -> torch.Tensor:
        channels = input.size(1)
        if channels == 0:
            raise ValueError("SyncBatchNorm needs an input with at least one channel")
        reduce_dims = [0, *range(2, input.dim())]
        compute = _compute_dtype(input.dtype)
        count = input.numel() // channels

        # Each rank fills its own row (count, mean, sum of squared deviations), so one sum
        # gathers all; the rows combine in float64 (Chan et al.'s pairwise update).
        rows = torch.zeros(size, 1 + 2 * channels, dtype=torch.float64, device=input.device)
        if count > 0:
            var, mean = torch.var_mean(input.to(compute), dim=reduce_dims, correction=0)
            rows[rank, 0] = count
            rows[rank, 1:1 + channels] = mean
            rows[rank, 1 + channels:] = var.to(torch.float64) * count
        with collective("sync batch norm"):
            plane.all_reduce(rows)
        counts = rows[:, :1]
        total = int(counts.sum().item())
        if total <= 1:
            raise ValueError("Expected more than 1 value per channel when training, got "
                             f"{total} over all ranks")
        means = rows[:, 1:1 + channels]
        global_mean = (counts * means).sum(0) / total
        sq_deviations = (rows[:, 1 + channels:] + counts * (means - global_mean) ** 2).sum(0)
        global_var = sq_deviations / total

        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_((momentum * global_mean).to(running_mean))
        if running_var is not None:
            unbiased = sq_deviations / (total - 1)
            running_var.mul_(1 - momentum).add_((momentum * unbiased).to(running_var))

        mean = global_mean.to(compute)
        invstd = torch.rsqrt(global_var + eps).to(compute)
        output = (input.to(compute) - _channel_view(mean, input.dim())) \
            * _channel_view(invstd, input.dim())
        if weight is not None:
            output = output * _channel_view(weight.to(compute), input.dim())
        if bias is not None:
            output = output + _channel_view(bias.to(compute), input.dim())

        ctx.save_for_backward(input, weight, mean, invstd)
        ctx.total = total
        ctx.bias_dtype = None if bias is None else bias.dtype
        return output.to(input.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        input, weight, mean, invstd = ctx.saved_tensors
        needs_input, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        dims = input.dim()
        reduce_dims = [0, *range(2, dims)]
        dy = grad_output.to(mean.dtype)
        x_hat = (input.to(mean.dtype) - _channel_view(mean, dims)) * _channel_view(invstd, dims)
        sum_dy = dy.sum(reduce_dims)
        sum_dy_x_hat = (dy * x_hat).sum(reduce_dims)

        grad_input = None
        if needs_input:
            # The input gradient needs the sums over every rank's samples.
            sums = torch.cat([sum_dy, sum_dy_x_hat]).to(torch.float64)
            with collective("sync batch norm"):
                plane.all_reduce(sums)
            all_dy, all_dy_x_hat = (s.to(mean.dtype) / ctx.total for s in sums.chunk(2))
            scale = invstd if weight is None else invstd * weight.to(mean.dtype)
            grad_input = ((dy - _channel_view(all_dy, dims)
                           - x_hat * _channel_view(all_dy_x_hat, dims))
                          * _channel_view(scale, dims)).to(input.dtype)

        grad_weight = sum_dy_x_hat.to(weight.dtype) if needs_weight else None
        grad_bias = sum_dy.to(ctx.bias_dtype) if needs_bias else None
        return grad_input, grad_weight, grad_bias, None, None, None, None, None, None
