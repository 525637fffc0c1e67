"""Memory planning: one training step measured on fake tensors, composed into each layout's bytes per
device (`gputrain plan`, `parallel.strategy=auto`, `train.batch_size=auto`)."""
