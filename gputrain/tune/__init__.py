"""`gputrain tune`: the layouts the memory plan says fit, each measured in fresh processes by a real
`gputrain train` of a few steps, and the fastest kept in tune.json for `parallel.strategy=tuned`.

candidates.py: what is tried (and what is pruned, with why); scheduler.py: the order, the budget and
the pruning by what failed; trial.py: one candidate's run and its figures; fingerprint.py: the
machine and the config a tune is for; record.py: tune.json; apply.py: `parallel.strategy=tuned`.
"""
