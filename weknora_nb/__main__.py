"""``python -m weknora_nb`` runs the command line."""

from weknora_nb.cli import run

raise SystemExit(run())
