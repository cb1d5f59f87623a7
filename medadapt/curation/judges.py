"""Relevance judges (CMedTEB §3.1): any callable ``judge(query, passages) -> grades`` (one level of the rubric
per passage; a ``name`` attribute labels its votes), and :class:`PromptJudge`, which makes one from any
text-completion callable and a :class:`~medadapt.curation.rubrics.Rubric` prompt.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from medadapt.curation.rubrics import CMEDTEB_RUBRIC, Rubric
from medadapt.errors import MedAdaptError, redact


class JudgeError(MedAdaptError):
    """A judge returned something that cannot be read as grades of the rubric."""


@runtime_checkable
class Judge(Protocol):
    def __call__(self, query: str, passages: list[str]) -> list[str]: ...


def judge_name(judge, index: int) -> str:
    return str(getattr(judge, "name", None) or f"judge{index}")


_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


def secrets_of(complete) -> list[str]:
    """The credential a completion function sends (``OpenAIChat.api_key``), for :func:`redact`."""
    key = getattr(complete, "api_key", None)
    return [key] if isinstance(key, str) else []


def extract_json(text: str, secrets=()) -> dict:
    """The JSON object in an LLM reply; a reply quoted in an error is redacted (``secrets``: the key sent)."""
    text = text or ""
    match = _JSON_OBJECT.search(text)
    if not match:
        raise JudgeError(f"judge reply holds no JSON object: {redact(text, secrets, 80)!r}")
    try:
        obj = json.loads(match.group(0))
    except (json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested thousands deep
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
        raise JudgeError(f"judge reply is not valid JSON ({reason}): {redact(text, secrets, 80)!r}") from None
    if not isinstance(obj, dict):
        raise JudgeError("judge reply is not a JSON object")
    return obj


def _grade(value, rubric: Rubric) -> str:
    grade = str(value).strip().strip('"').upper()
    if grade not in rubric.levels:
        raise JudgeError(f"grade {value!r} is not one of {', '.join(rubric.levels)} (rubric {rubric.name})")
    return grade


def parse_grades(reply: str, rubric: Rubric, num_passages: int) -> list[str]:
    """Grades from ``{"Passage-i": grade}`` (batch rubrics) or ``{"score": grade}`` (per-passage rubrics)."""
    obj = extract_json(reply)
    if rubric.per_passage:
        if "score" not in obj:
            raise JudgeError("judge reply has no 'score' field")
        return [_grade(obj["score"], rubric)]
    missing = [i for i in range(num_passages) if f"Passage-{i}" not in obj]
    if missing:
        raise JudgeError(f"judge reply misses Passage-{missing[0]} "
                         f"({len(missing)} of {num_passages} missing)")
    return [_grade(obj[f"Passage-{i}"], rubric) for i in range(num_passages)]


class PromptJudge:
    """A judge from ``complete(prompt) -> reply`` (e.g. :class:`~medadapt.curation.OpenAIChat`);
    ``retries``: extra attempts on an unreadable reply; ``fields``: extra template fields (CURE's
    ``clinical_role``)."""

    def __init__(self, complete: Callable[[str], str], rubric: Rubric = CMEDTEB_RUBRIC,
                 name: str | None = None, retries: int = 1, **fields):
        self.complete = complete
        self.rubric = rubric
        self.name = name or getattr(complete, "name", None) or "prompt-judge"
        self.retries = retries
        self.fields = fields

    def __call__(self, query: str, passages: list[str]) -> list[str]:
        prompts = self.rubric.render(query, passages, **self.fields)
        grades: list[str] = []
        for prompt in prompts:
            n = 1 if self.rubric.per_passage else len(passages)
            for attempt in range(self.retries + 1):
                try:
                    grades.extend(parse_grades(self.complete(prompt), self.rubric, n))
                    break
                except JudgeError as exc:  # a grade quoted from the reply: redacted with the key sent
                    if attempt == self.retries:
                        raise JudgeError(redact(str(exc), secrets_of(self.complete))) from None
        return grades
