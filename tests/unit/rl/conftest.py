from tests.one_thread import one_thread  # noqa: F401  (autouse: RL's tensors are tiny)
