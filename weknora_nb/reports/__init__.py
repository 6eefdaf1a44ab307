"""Reports: tables, figures, notebook helpers, rendering notebooks into HTML, plain-text output.

Imports the core and the analysis layer.
"""
