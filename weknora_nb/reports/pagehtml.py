"""A report page's HTML from its executed notebook: nbconvert's HTML exporter with the reports' template
(``templates/report``: JupyterLab's, each figure's description as its alt text, no script fetched from the
internet, so that a page opens from disk or an attachment)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from weknora_nb.core.errors import writing

log = logging.getLogger(__name__)

#: the reports' templates
TEMPLATES = str(Path(__file__).parent / "templates")


def exporter(no_input: bool) -> Any:
    """The reports' exporter: nbconvert's ``HTMLExporter`` with the reports' template; ``no_input``: code cells and
    prompts hidden. A new one for each page: nbconvert's exporters are not shared across threads."""
    from nbconvert import HTMLExporter

    logging.getLogger("traitlets").setLevel(logging.ERROR)  # nbconvert's notice of an image without alt text
    return HTMLExporter(template_name="report", extra_template_basedirs=[TEMPLATES], exclude_input=no_input,
                        exclude_input_prompt=no_input, exclude_output_prompt=no_input)


def write_page(nb: Any, html_path: Path, *, no_input: bool) -> None:
    """Write the executed notebook ``nb`` as the page ``html_path`` (:func:`exporter`)."""
    body, _ = exporter(no_input).from_notebook_node(nb)
    with writing(html_path):
        html_path.write_text(body, encoding="utf-8")
