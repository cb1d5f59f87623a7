"""The report's HTML: one self-contained page rendered with Jinja2 with autoescaping on, a
``Content-Security-Policy`` that allows no script and no network access, and figures embedded as ``data:``
URIs, so the page is one file written atomically. See docs/report.md.
"""

from __future__ import annotations

import base64
from typing import Any

__all__ = ["Figure", "render"]

_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="medadapt {{ version }}">
<title>medadapt run report: {{ run.name }}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.92em; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.gain { color: #176e2c; } .loss { color: #b3261e; }
.note { background: #fff8e1; border-left: 4px solid #f0b400; padding: 0.4em 0.8em; margin: 0.6em 0; }
.meta { color: #555; } figure { margin: 1em 0; } figcaption { color: #555; font-size: 0.9em; }
img { max-width: 100%; height: auto; } code { background: #f4f4f4; padding: 0 0.2em; }
td.text { max-width: 42em; overflow-wrap: anywhere; }
</style>
</head>
<body>
<h1>Run report: {{ run.name }}</h1>
<p class="meta">{{ run.description }}</p>
<p class="meta">Folder <code>{{ run_path }}</code> &middot; recipe kind <code>{{ run.kind }}</code>
{% if facts %}&middot; {{ facts | join(" · ") }}{% endif %}</p>
{% for note in run.notes %}<p class="note">{{ note }}</p>
{% endfor %}
<nav><a href="#training">training</a> · <a href="#expert-load">expert load</a> · <a href="#scores">scores</a> ·
<a href="#metrics">metrics</a> · <a href="#queries">queries</a></nav>

<section id="training">
<h2>Training curves</h2>
{% if figures.loss %}{{ figure(figures.loss) }}
<p class="meta">Loss parts: {% for p in loss_parts %}<code>{{ p }}</code>{% if not loop.last %}, {% endif %}{% endfor %}.</p>
{% else %}<p class="note">No loss history in train_log.json.</p>{% endif %}
</section>

<section id="expert-load">
<h2>Expert load</h2>
{% for note in expert_notes %}<p class="note">{{ note }}</p>
{% endfor %}
{% if figures.load_bars %}{{ figure(figures.load_bars) }}{% endif %}
{% if figures.load_curves %}{{ figure(figures.load_curves) }}{% endif %}
{% if load_table %}
<table><thead><tr><th>expert</th>{% for col in load_table.columns %}<th class="num">{{ col }}</th>{% endfor %}</tr></thead>
<tbody>{% for row in load_table.rows %}<tr><td>{{ row.name }}</td>{% for v in row["values"] %}<td class="num">{{ "%.3f" | format(v) }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table>
{% endif %}
</section>

<section id="scores">
<h2>Scores of positives vs hard negatives</h2>
{% for note in analysis_notes %}<p class="note">{{ note }}</p>
{% endfor %}
{% if figures.scores %}{{ figure(figures.scores) }}
<table><thead><tr><th>model</th><th class="num">mean positive</th><th class="num">mean hard negative</th>
<th class="num">margin</th></tr></thead><tbody>
{% for row in score_table %}<tr><td>{{ row.model }}</td><td class="num">{{ "%.4f" | format(row.pos) }}</td>
<td class="num">{{ "%.4f" | format(row.neg) }}</td><td class="num">{{ "%+.4f" | format(row.pos - row.neg) }}</td></tr>
{% endfor %}</tbody></table>
{% endif %}
</section>

<section id="metrics">
<h2>Metrics vs the frozen baseline</h2>
{% if metric_table %}
<p class="meta">From <code>metrics.json</code> and <code>baseline_metrics.json</code> ({{ eval_where }}).</p>
{% if figures.metrics %}{{ figure(figures.metrics) }}{% endif %}
<table><thead><tr><th>metric</th><th class="num">frozen base</th><th class="num">trained</th><th class="num">difference</th></tr></thead><tbody>
{% for row in metric_table %}<tr><td>{{ row.metric }}</td>
<td class="num">{% if row.base is not none %}{{ "%.4f" | format(row.base) }}{% else %}&ndash;{% endif %}</td>
<td class="num">{% if row.trained is not none %}{{ "%.4f" | format(row.trained) }}{% else %}&ndash;{% endif %}</td>
<td class="num {{ row.cls }}">{% if row.delta is not none %}{{ "%+.4f" | format(row.delta) }}{% else %}&ndash;{% endif %}</td></tr>
{% endfor %}</tbody></table>
{% else %}<p class="note">No metrics in this run folder.</p>{% endif %}
{% if analysis_means %}<p class="meta">Recomputed on {{ analysis_where }}:
{% for label, value in analysis_means.items() %}{{ label }} nDCG@10 {{ "%.4f" | format(value) }}{% if not loop.last %}, {% endif %}{% endfor %}.</p>{% endif %}
</section>

<section id="queries">
<h2>Queries that gained or lost most</h2>
{% if query_tables %}
<p class="meta">Per-query nDCG@10 (pytrec_eval) on {{ analysis_where }}.</p>
{% if figures.per_query %}{{ figure(figures.per_query) }}{% endif %}
{% for title, rows in query_tables %}
<h3>{{ title }}</h3>
{% if rows %}<table><thead><tr><th>query id</th><th>query</th><th class="num">frozen base</th><th class="num">trained</th><th class="num">difference</th></tr></thead><tbody>
{% for r in rows %}<tr><td>{{ r.qid }}</td><td class="text">{{ r.text }}</td><td class="num">{{ "%.4f" | format(r.base) }}</td>
<td class="num">{{ "%.4f" | format(r.trained) }}</td><td class="num {{ 'gain' if r.delta > 0 else 'loss' }}">{{ "%+.4f" | format(r.delta) }}</td></tr>
{% endfor %}</tbody></table>{% else %}<p class="meta">None.</p>{% endif %}
{% endfor %}
{% else %}<p class="note">{{ queries_note }}</p>{% endif %}
</section>
<p class="meta">Written by medadapt {{ version }}.</p>
</body>
</html>
"""


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

    return env.from_string(_TEMPLATE).render(figure=figure, **context)
