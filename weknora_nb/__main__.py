"""``python -m weknora_nb`` runs the command line."""

from .cli import main

raise SystemExit(main())
