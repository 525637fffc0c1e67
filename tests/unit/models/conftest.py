# The models' and data sources' tests train tiny models: one intra-op thread (see tests/one_thread.py).
from tests.one_thread import one_thread  # noqa: F401  (an autouse fixture)
