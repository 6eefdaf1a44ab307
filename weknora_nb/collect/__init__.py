"""Collection: an httpx client for WeKnora (``client``, ``envelope``), stages as data, what the server says
before a run (``preflight``), the resumable collector and its checkpoint, the chunk inventory, the chat
sessions a run created.

Imports the core only.
"""

from weknora_nb.collect.client import ClientSettings, WeKnoraClient
from weknora_nb.collect.collector import RunSummary, collect, collect_async, read_checkpoint
from weknora_nb.collect.stages import DEFAULT_STAGES, Stage, load_stage_file, resolve_stages

__all__ = ["ClientSettings", "WeKnoraClient", "RunSummary", "collect", "collect_async", "read_checkpoint",
           "DEFAULT_STAGES", "Stage", "load_stage_file", "resolve_stages"]
