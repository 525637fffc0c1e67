"""torch.distributed plumbing: rank context, gradient-sync control and parallelism."""

from gputrain.distributed.context import (
    DistContext,
    all_reduce_mean,
    grad_sync,
    init_distributed,
    shutdown_distributed,
)
from gputrain.distributed.parallelize import parallelize

__all__ = ["DistContext", "all_reduce_mean", "grad_sync", "init_distributed", "parallelize",
           "shutdown_distributed"]
