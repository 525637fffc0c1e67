"""`gputrain report`: one self-contained HTML file of a run (curves, speed, ROC), or several runs
compared, from the run directories' own files. No server, no network: everything is inline."""
