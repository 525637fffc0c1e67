"""torch.distributed plumbing: rank context, gradient-sync control and parallelism.

Import from the modules themselves (`context`, `parallelize`, ...): the package imports nothing, so
reaching `distributed.context` never drags in the parallelism modules.
"""
