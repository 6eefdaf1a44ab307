"""Analysis: intervals and tests, stratification, degraded-query causes, comparison, the gate.

Imports the core only.
"""
