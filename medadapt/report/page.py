"""The report's HTML: ``page.html`` rendered with Jinja2 (autoescaping on; a ``Content-Security-Policy`` that
allows no script and no network access), figures embedded as ``data:`` URIs: one self-contained file."""

from __future__ import annotations

import base64
from importlib.resources import files
from typing import Any

__all__ = ["Figure", "render"]


class Figure:
    """A PNG with its alternative text and caption, shown as an ``<img>`` with a ``data:`` URI."""

    def __init__(self, name: str, png: bytes, alt: str, caption: str = "") -> None:
        self.name, self.png, self.alt, self.caption = name, png, alt, caption

    def data_uri(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png).decode("ascii")


def render(context: dict[str, Any]) -> str:
    """The page for ``context`` (see :func:`medadapt.report.build.build_report` for its keys)."""
    from jinja2 import Environment
    from markupsafe import Markup, escape

    env = Environment(autoescape=True, trim_blocks=False, lstrip_blocks=False)

    def figure(fig: Figure) -> Markup:
        caption = f"<figcaption>{escape(fig.caption)}</figcaption>" if fig.caption else ""
        return Markup(f'<figure id="fig-{escape(fig.name)}"><img src="{fig.data_uri()}" alt="{escape(fig.alt)}">'
                      f"{caption}</figure>")

    template = files("medadapt.report").joinpath("page.html").read_text(encoding="utf-8")
    return env.from_string(template).render(figure=figure, **context)
