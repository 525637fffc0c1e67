"""Use what a run trained: evaluate, predict, generate, export and benchmark inference, each from
the run directory alone (its config.toml and the final, best, last or a named checkpoint).

`loaded.load_run` is the small builder they share: the run's config, its data (spec and
preprocessing) and its model with the chosen weights loaded, nothing of training's loop.
"""
