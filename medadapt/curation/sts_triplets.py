"""Synonym STS triplets (CMedTEB §3.1, Appendix F Table 24): per (term, synonym) pair and sentence, a
generator writes a positive (synonym substituted, same meaning), a hard negative (another question using the
synonym) and an easy negative (another question keeping the term). A generator is any callable
``generator(SynonymExample) -> dict`` (keys ``positive``, ``hard_negative`` / ``negative-1``, ``easy_negative``
/ ``negative-2``); :class:`PromptGenerator` uses the paper's prompt. Pairs for :func:`medadapt.data.load_sts`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from medadapt.curation.judges import JudgeError, extract_json, secrets_of
from medadapt.data.jsonl import iter_lines
from medadapt.data.text import decode_json
from medadapt.errors import DataError
from medadapt.progress import progress

STS_TEMPLATE = """\
Medical Query Rewriting Sample Generation (Positive and Negative Examples)
Task Objective: Your task is to generate one positive example and two negative examples based on a given original medical query and a set of synonyms.
You will receive a JSON object containing the following fields:
"origin": "Original medical term",
"replace": "Synonym medical term for replacement",
"query_pairs": {{ "origin": "Query sentence using the original term", "replace": "Query sentence using the replaced term" }}
Generation Rules:
1. General Quality Standards (applicable to all outputs):
- Professional Expression: Use professional, fluent, and natural medical language.
- Medical Accuracy: Content must conform to medical knowledge and avoid ambiguity.
- Format Requirement: All outputs must be complete, fluent interrogative sentences.
2. Specific Sample Requirements:
- positive (Positive Example):
  - Task: Optimize and rewrite the second query in query_pairs (the one containing the "replace" term).
  - Intent: Must preserve the exact same intent as the original query.
  - Terminology: Must use the term specified in the "replace" field.
  - Constraint: Rewritten query length must be within ±30% of the original query's length.
- negative-1 (Negative Example 1):
  - Task: Create a new query based on the topic of the original query, similar but distinctly different.
  - Terminology: Must use the term specified in the "replace" field.
  - Intent: Significantly alter the intent of the original query.
- negative-2 (Negative Example 2):
  - Task: Create a new query based on the topic of the original query, similar but distinctly different.
  - Terminology: Must use the term specified in the "origin" field.
  - Intent: Significantly alter the intent of the original query (same rule as negative-1).
Output Format: Must be a JSON object containing only the following three fields: "positive", "negative-1", "negative-2". Do not add any extra explanations or comments.
Input: {input}
Output:"""


@dataclass(frozen=True)
class SynonymExample:
    """The term, its synonym, the sentence and its substituted form."""

    origin: str
    replace: str
    origin_query: str
    replace_query: str

    def to_prompt_input(self) -> dict:
        return {"origin": self.origin, "replace": self.replace,
                "query_pairs": {"origin": self.origin_query, "replace": self.replace_query}}


@dataclass
class StsTriplet:
    anchor: str
    origin: str
    replace: str
    positive: str
    hard_negative: str
    easy_negative: str

    def to_dict(self) -> dict:
        return asdict(self)


class Generator(Protocol):
    def __call__(self, example: SynonymExample) -> dict: ...


class PromptGenerator:
    """A generator from ``complete(prompt) -> reply`` with the paper's prompt."""

    def __init__(self, complete: Callable[[str], str], template: str = STS_TEMPLATE):
        self.complete = complete
        self.template = template

    def __call__(self, example: SynonymExample) -> dict:
        prompt = self.template.format(input=json.dumps(example.to_prompt_input(), ensure_ascii=False))
        return extract_json(self.complete(prompt), secrets_of(self.complete))


def load_synonyms(path: str | Path) -> dict[str, list[str]]:
    """A synonym dictionary from JSON ``{term: [synonym, ...]}`` or TSV ``term<TAB>synonym[<TAB>...]``."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"synonym dictionary not found: {path}")
    text = "".join(line for _, line in iter_lines(path, "synonym dictionary"))  # UTF-8, checked per line
    if path.suffix == ".json":
        obj = decode_json(text, path)  # bad JSON, depth, huge numbers, duplicate keys, lone surrogates
        if not isinstance(obj, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(s, str) for s in v)
            for k, v in obj.items()
        ):
            raise DataError(f"{path}: expected a JSON object {{term: [synonym, ...]}}")
        out = {k: v for k, v in obj.items()}
    else:
        out = {}
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip() or line.startswith("#"):
                continue
            cols = [c.strip() for c in line.split("\t") if c.strip()]
            if len(cols) < 2:
                raise DataError(f"{path}:{lineno}: expected 'term<TAB>synonym', got {line[:60]!r}")
            out.setdefault(cols[0], []).extend(cols[1:])
    out = {k.strip(): [s.strip() for s in v if s.strip() and s.strip() != k.strip()] for k, v in out.items()}
    out = {k: v for k, v in out.items() if k and v}
    if not out:
        raise DataError(f"{path}: no synonym pairs")
    return out


def synonym_pairs(synonyms: dict[str, Sequence[str]], symmetric: bool = True) -> list[tuple[str, str]]:
    """Ordered ``(origin, replace)`` pairs; with ``symmetric`` each group's terms replace one another."""
    pairs: set[tuple[str, str]] = set()
    for term, syns in synonyms.items():
        group = [term, *syns]
        for a in group if symmetric else [term]:
            pairs.update((a, b) for b in group if a != b)
    return sorted(pairs)


def _normalize_output(out) -> dict:
    if not isinstance(out, dict):
        raise JudgeError(f"generator must return a dict, got {type(out).__name__}")
    keys = {"positive": "positive", "hard_negative": "hard_negative", "negative-1": "hard_negative",
            "easy_negative": "easy_negative", "negative-2": "easy_negative"}
    norm = {keys[k]: v for k, v in out.items() if k in keys}
    missing = {"positive", "hard_negative", "easy_negative"} - set(norm)
    if missing or not all(isinstance(v, str) and v.strip() for v in norm.values()):
        raise JudgeError(f"generator output lacks non-empty {sorted(missing) or 'strings'}: {str(out)[:80]}")
    return {k: v.strip() for k, v in norm.items()}


@dataclass
class StsReport:
    pairs: int = 0
    examples: int = 0
    triplets: int = 0
    rejected: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def build_sts_triplets(
    synonyms: dict[str, Sequence[str]],
    sentences: Iterable[str],
    generator: Generator,
    *,
    per_pair: int = 1,
    symmetric: bool = True,
    require_terms: bool = True,
    seed: int = 42,
    show_progress: bool = True,
    report: StsReport | None = None,
) -> list[StsTriplet]:
    """Per ``(origin, replace)`` pair, up to ``per_pair`` sentences with ``origin`` (seeded) through
    ``generator``. ``require_terms`` rejects (and counts) an output unless the positive and hard negative
    hold ``replace``, the easy negative ``origin``, and none equals the anchor."""
    if per_pair < 1:
        raise ValueError(f"per_pair must be >= 1, got {per_pair}")
    report = report if report is not None else StsReport()
    sentences = list(dict.fromkeys(s.strip() for s in sentences if s and s.strip()))
    examples: list[SynonymExample] = []
    for origin, replace in synonym_pairs(synonyms, symmetric):
        report.pairs += 1
        matches = [s for s in sentences if origin in s]
        if len(matches) > per_pair:
            matches = random.Random(f"{seed}\x00{origin}\x00{replace}").sample(matches, per_pair)
        examples += [SynonymExample(origin, replace, s, s.replace(origin, replace)) for s in matches]
    report.examples = len(examples)
    triplets: list[StsTriplet] = []
    for ex in progress(examples, desc="generating", unit="example", disable=not show_progress):
        out = _normalize_output(generator(ex))
        if require_terms and not (
            ex.replace in out["positive"] and ex.replace in out["hard_negative"]
            and ex.origin in out["easy_negative"]
            and ex.origin_query not in (out["positive"], out["hard_negative"], out["easy_negative"])
        ):
            report.rejected += 1
            continue
        triplets.append(StsTriplet(ex.origin_query, ex.origin, ex.replace, **out))
    report.triplets = len(triplets)
    return triplets


def to_sts_pairs(
    triplets: Sequence[StsTriplet], scores: tuple[float, float, float] = (1.0, 0.0, 0.0)
) -> list[dict]:
    """``{sentence1, sentence2, score}`` rows: anchor with positive / hard negative / easy negative."""
    rows = []
    for t in triplets:
        for other, score in zip((t.positive, t.hard_negative, t.easy_negative), scores):
            rows.append({"sentence1": t.anchor, "sentence2": other, "score": score})
    return rows
