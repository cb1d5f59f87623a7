"""Model cards (``README.md``) of saved folders: what the model is, how it was trained, how well it does
beside the frozen base, how to load it. A full model folder's sentence-transformers card gets a medadapt
section; an adapter-only folder gets its own card with hub front matter. Loading never reads a card.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from medadapt.io import atomic_write_text

__all__ = ["card_text", "front_matter", "write_card"]

MARK = "<!-- medadapt -->"


def _size(folder: Path) -> str:
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return f"{total / 1e6:.1f} MB"


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def _metrics_table(metrics: dict[str, float], baseline: dict[str, float] | None,
                   peers: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """This model beside the frozen base and, one column each, the peer baselines of ``eval.peers``."""
    if not metrics:
        return ["Not evaluated in this run (`medadapt eval --model <this folder> --data ...`)."]
    peers = peers or {}
    rows = ["| metric | this model | frozen base model |" + "".join(f" {p} (peer) |" for p in peers),
            "|---|---|---|" + "---|" * len(peers)]
    for key, value in metrics.items():
        base = (baseline or {}).get(key)
        rows.append(f"| {key} | {value:.4f} | {_cell(base)} |"
                    + "".join(f" {_cell(p['metrics'].get(key))} |" for p in peers.values()))
    return rows


def _also_table(also: dict[str, dict[str, dict[str, float]]],
                peers: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """The ``eval.also`` sets: a row per set and metric (this model, frozen base, change, peers)."""
    peers = peers or {}
    rows = ["| data set | metric | this model | frozen base model | change |"
            + "".join(f" {p} (peer) |" for p in peers), "|---|---|---|---|---|" + "---|" * len(peers)]
    for name, row in also.items():
        for key, value in row.get("trained", {}).items():
            base, delta = row.get("base", {}).get(key), row.get("delta", {}).get(key)
            rows.append(f"| {name} | {key} | {value:.4f} | {_cell(base)} | "
                        f"{'' if delta is None else f'{delta:+.4f}'} |"
                        + "".join(f" {_cell(p['also'].get(name, {}).get(key))} |" for p in peers.values()))
    return rows


def _peers_note(peers: dict[str, dict[str, Any]]) -> list[str]:
    """What the peer columns are (``eval.peers``): trained in the same run, not saved."""
    if not peers:
        return []
    each = ", ".join(f"{label} ({row['train_seconds']:.0f} s of training)" for label, row in peers.items())
    return ["Peer baselines (`eval.peers`): " + each + ", trained in this run on the same cached training "
            "embeddings and scored on the same data; only their scores are kept (they are not in this "
            "folder).",
            ""]


def card_text(folder: Path, *, descriptions: dict[str, str] | None = None, adapter: dict[str, Any] | None = None,
              recipe: dict[str, Any] | None = None, metrics: dict[str, float] | None = None,
              baseline: dict[str, float] | None = None, eval_split: str | None = None,
              data: str | None = None, train_seconds: float | None = None,
              standalone: bool = False, name: str | None = None,
              also: dict[str, dict[str, dict[str, float]]] | None = None,
              peers: dict[str, dict[str, Any]] | None = None) -> str:
    """The medadapt card section (Markdown) of ``folder`` (``name``: its final name, as cards are written
    into a temporary folder). ``also``: ``{set: {"base", "trained", "delta"}}``; ``peers``: ``{label:
    {"metrics", "also", "train_seconds"}}``, a column each."""
    recipe = recipe or {}
    name = name or folder.name
    base = (adapter or {}).get("base_model", {})
    base_label = base.get("name") or base.get("folder_name") or (recipe.get("model") or {}).get("backbone") \
        or "the base model"
    lines = [MARK, "", f"# {recipe.get('name') or name}", ""]
    if recipe.get("description"):
        lines += [str(recipe["description"]), ""]
    lines += ["Made with [medadapt](https://github.com/medadapt/medadapt): small trainable heads on a frozen "
              "Sentence-Transformers embedder for medical retrieval.", "", "## Model", "",
              f"- Base model: `{base_label}`" + (f" (weights fingerprint `{base['fingerprint']}`)"
                                                 if base.get("fingerprint") else "")]
    if adapter:
        for head, spec in adapter.get("adapters", {}).items():
            where = spec.get("location", "all")
            where = "every input" if where == "all" else f"the {where} route"
            lines.append(f"- Head `{head}` ({spec.get('type')}, on the pooled embedding of {where}): "
                         f"{(descriptions or {}).get(head, '')}")
        n = adapter.get("weights", {}).get("parameters")
        lines.append(f"- Folder: adapter only, {_size(folder)}" + (f", {n:,} head parameters" if n else "")
                     + "; it loads onto the base model named above and refuses any other.")
    if not adapter:
        for head, line in (descriptions or {}).items():
            lines.append(f"- Head `{head}`: {line}")
    branches = [b.get("kind") for b in recipe.get("branches") or [] if isinstance(b, dict)]
    for kind in branches:
        lines.append(f"- Branch `{kind}`: composed beside the dense side and saved in this folder with it "
                     "(one model: per-mode metrics below are `<mode>/<metric>`)")
    if standalone:
        lines.append(f"- Folder: standalone model (base model included), {_size(folder)}")
    lines += ["", "## Training", ""]
    if recipe:
        lines.append(f"- Recipe: `kind: {recipe.get('kind')}`, `{recipe.get('name')}` (the full recipe is "
                     "`recipe.yaml` in this folder; `medadapt train recipe.yaml` re-runs it)")
        d = recipe.get("data") or {}
        lines.append(f"- Training data: `{d.get('path')}`, split `{d.get('train_split', 'train')}`")
    else:
        lines.append("- Trained outside a recipe (Python API).")
    if train_seconds is not None:
        lines.append(f"- Training time: {train_seconds:.0f} s")
    where = f" on `{data}`, split `{eval_split}`" if data and eval_split else ""
    lines += ["", f"## Evaluation{where}", "", *_metrics_table(metrics or {}, baseline, peers), ""]
    lines += _peers_note(peers or {}) if metrics else []
    if also:
        lines += ["## Evaluation on other data (`eval.also`)", "",
                  "The same metrics on sets beside the training domain: a head that gains on its own data can "
                  "lose elsewhere.", "", *_also_table(also, peers), ""]
    lines += ["## How to load", ""]
    lines += _usage(name, adapter, base_label)
    if branches:
        lines += ["", "The composed model as a whole (dense + branch), evaluated or indexed in one pass:", "",
                  "```bash", f"medadapt eval --model {name} --data DATA_DIR --split test --mode hybrid",
                  f"medadapt index --model {name} --corpus DATA_DIR --kind hybrid --out {name}-index", "```",
                  "", "(`medadapt.load` above gives the dense side alone.)"]
    return "\n".join(lines) + "\n"


def _usage(folder: str, adapter: dict[str, Any] | None, base_label: str) -> list[str]:
    lines = ["```python", "import medadapt", "", f'model = medadapt.load("{folder}")  # this folder'
             + (" and its base model" if adapter else ""),
             'embeddings = model.encode_query(["what are the symptoms of anemia?"])', "```"]
    if adapter:
        lines += ["", "Onto your own copy of the base model (it must be the same weights; a plain "
                  "`SentenceTransformer` of it works too once `medadapt.adapters` is imported; without "
                  "medadapt, sentence-transformers and PEFT stop with a message saying so):", "",
                  "```python", "import medadapt", "",
                  f'model = medadapt.load("{base_label}")  # the base model',
                  f'model.load_adapter("{folder}")', "```"]
    else:
        lines += ["", "With sentence-transformers directly (the medadapt modules are classes outside its "
                  "package):", "", "```python", "from sentence_transformers import SentenceTransformer", "",
                  f'model = SentenceTransformer("{folder}", trust_remote_code=True)', "```"]
    return lines


def front_matter(adapter: dict[str, Any]) -> str:
    """An adapter card's YAML front matter by the hub's conventions: ``library_name: sentence-transformers``,
    ``base_model`` (+ ``base_model_relation: adapter``) when the base is a hub id or alias, never a local
    path, and tags (``medadapt``, each head's type, ...)."""
    kinds = sorted({str(spec.get("type")) for spec in (adapter.get("adapters") or {}).values()
                    if isinstance(spec, dict) and spec.get("type")})
    meta: dict[str, Any] = {"library_name": "sentence-transformers"}
    hub_id = adapter.get("base_model_name_or_path")
    if hub_id and (adapter.get("base_model") or {}).get("name"):  # a name, not a relative path
        meta["base_model"] = str(hub_id)
        meta["base_model_relation"] = "adapter"
    meta["tags"] = list(dict.fromkeys(["medadapt", "sentence-transformers", *kinds, "medical-retrieval"]))
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n\n"


def write_card(folder: str | Path, **facts: Any) -> Path:
    """Write (adapter folder) or extend (sentence-transformers' ``README.md``) the card of ``folder``;
    rewriting replaces an earlier medadapt section. Returns the card's path."""
    folder = Path(folder)
    path = folder / "README.md"
    existing = path.read_text(encoding="utf-8") if path.is_file() else ""
    if MARK in existing:
        existing = existing[: existing.index(MARK)].rstrip()
    section = card_text(folder, **facts)
    if existing and not facts.get("adapter"):
        text = existing + "\n\n" + section
    else:
        text = front_matter(facts.get("adapter") or {}) + section
    atomic_write_text(path, text)
    return path
