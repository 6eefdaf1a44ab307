"""Chinese text in every report, whatever fonts the reader's machine has: a subset of WenQuanYi Micro Hei holding
the CJK characters of the pages, embedded in each page as the last fallback of its font stacks."""

from __future__ import annotations

import base64
import io
import logging
from pathlib import Path

from weknora_nb.core.errors import writing

log = logging.getLogger(__name__)

#: the font stacks of the reports' text, the embedded subset last
FONT_STACK = ("system-ui, -apple-system, 'Segoe UI', 'PingFang SC', 'Microsoft YaHei', 'Noto Sans CJK SC', "
              "sans-serif, 'weknora-cjk'")


def cjk_font_css(text: str) -> str:
    """A ``<style>`` that embeds the CJK characters of ``text`` (code points from U+2E80) as a subset of WenQuanYi
    Micro Hei; "" when ``text`` has no CJK character or the font package is missing."""
    chars = {ord(c) for c in text if ord(c) >= 0x2E80}
    if not chars:
        return ""
    try:
        import paperang_p2_fonts_cjk
        from fontTools import subset
        from fontTools.ttLib import TTFont
    except ImportError:
        log.warning("no CJK font package: reports rely on the reader's fonts for Chinese")
        return ""
    path = next((Path(paperang_p2_fonts_cjk.__file__).parent / "fonts").glob("*.tt*"))
    font = TTFont(str(path), fontNumber=0)
    options = subset.Options()
    options.hinting = False
    options.layout_features = ["*"]
    logging.getLogger("fontTools").setLevel(logging.ERROR)
    sub = subset.Subsetter(options)
    sub.populate(unicodes=chars)
    sub.subset(font)
    buf = io.BytesIO()
    font.save(buf)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return (f"<style>@font-face{{font-family:'weknora-cjk';src:url(data:font/ttf;base64,{data}) format('truetype');}}"
            f":root{{--jp-content-font-family:{FONT_STACK};--jp-ui-font-family:{FONT_STACK};"
            f"--jp-code-font-family:monospace, 'weknora-cjk';}}body{{font-family:{FONT_STACK};}}</style>")


def embed_font(pages: list[Path]) -> None:
    """Add one shared CJK font subset (the characters of all ``pages``) to each page's head."""
    texts = [p.read_text(encoding="utf-8") for p in pages]
    css = cjk_font_css("".join(set("".join(texts))))  # each character once: the pages are megabytes of it
    if not css:
        return
    for p, t in zip(pages, texts, strict=True):
        with writing(p):
            p.write_text(t.replace("</head>", css + "</head>", 1), encoding="utf-8")
