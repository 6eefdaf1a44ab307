"""Foundation: test sets, results tables, metrics, tiers, the pipeline's stages, scoring, the run folder.

Nothing here talks to a network or draws: every other layer builds on this one.
"""
