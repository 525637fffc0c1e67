# The signals first, before anything else loads (gputrain.interrupts imports nothing heavy): a
# signal while the command starts is one line and exit 130, never 128+N and no word.
from gputrain.interrupts import guard_the_start

guard_the_start()

from gputrain.cli import entry  # noqa: E402 - after the guard, on purpose

entry()
