from gputrain.cli import entry

entry()
