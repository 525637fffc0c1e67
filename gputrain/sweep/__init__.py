"""`gputrain sweep`: a hyperparameter search over Optuna whose trials are ordinary gputrain runs.

space.py reads and checks the search space, layout.py names the sweep directory's files, study.py
opens the study and keeps its trial budget (several sweep processes share one study), trial.py runs
one trial as a `gputrain sweep-trial` process, pruning.py is the callback inside it that reports
the validation metric, best.py writes best.toml. Nothing here imports torch: the trials do.
"""
