"""Multi-judge consensus labelling (CMedTEB §3.1): a pair is kept only when the judges agree (``unanimous``,
the paper's rule, or strict ``majority``) on labels or grades; agreement as Fleiss' kappa (docs/curation.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from medadapt.curation.judges import Judge, JudgeError, judge_name
from medadapt.curation.kappa import category_counts, fleiss_kappa
from medadapt.curation.rubrics import CMEDTEB_RUBRIC, Rubric
from medadapt.data.training import TrainingGroup
from medadapt.progress import progress

Policy = Literal["unanimous", "majority"]
POLICIES = ("unanimous", "majority")


@dataclass
class LabeledPair:
    """One judged pair. ``label`` / ``grade`` are ``None`` when the pair was dropped."""

    query: str
    passage: str
    votes: dict[str, str]
    agreement: int
    label: int | None
    grade: str | None

    @property
    def kept(self) -> bool:
        return self.label is not None

    def to_dict(self) -> dict:
        return {"query": self.query, "passage": self.passage, "label": self.label, "grade": self.grade,
                "agreement": self.agreement, "votes": self.votes}


@dataclass
class ConsensusResult:
    pairs: list[LabeledPair]
    judges: list[str]
    policy: str
    agreement_on: str
    kappa_labels: float
    kappa_grades: float
    extra: dict = field(default_factory=dict)

    @property
    def kept(self) -> list[LabeledPair]:
        return [p for p in self.pairs if p.kept]

    def summary(self) -> dict:
        kept = self.kept
        return {
            "pairs": len(self.pairs), "kept": len(kept), "dropped": len(self.pairs) - len(kept),
            "positives": sum(p.label == 1 for p in kept), "negatives": sum(p.label == 0 for p in kept),
            "judges": self.judges, "policy": self.policy, "agreement_on": self.agreement_on,
            "fleiss_kappa_labels": self.kappa_labels, "fleiss_kappa_grades": self.kappa_grades,
        }

    def to_training_groups(self) -> list[TrainingGroup]:
        """Kept pairs per query (label 1: ``pos``, 0: ``neg``), queries with a positive only."""
        groups: dict[str, TrainingGroup] = {}
        for p in self.kept:
            g = groups.setdefault(p.query, TrainingGroup(query=p.query, pos=[], neg=[]))
            (g.pos if p.label == 1 else g.neg).append(p.passage)
        return [g for g in groups.values() if g.pos]


def decide(grades: Sequence[str], rubric: Rubric, policy: Policy = "unanimous",
           agreement_on: Literal["label", "grade"] = "label") -> tuple[int, int | None, str | None]:
    """``(agreement, label, grade)`` of one pair (label and grade ``None`` when dropped); the grade is the
    agreeing judges' most common, ties to the lower level."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; valid policies: {', '.join(POLICIES)}")
    if agreement_on not in ("label", "grade"):
        raise ValueError(f"agreement_on must be 'label' or 'grade', got {agreement_on!r}")
    n = len(grades)
    values = [rubric.label(g) for g in grades] if agreement_on == "label" else list(grades)
    counts = Counter(values)
    value, agreement = counts.most_common(1)[0]
    tied = sum(c == agreement for c in counts.values()) > 1
    ok = agreement == n if policy == "unanimous" else (agreement * 2 > n and not tied)
    if not ok:
        return agreement, None, None
    agreeing = [g for g, v in zip(grades, values) if v == value]
    gcounts = Counter(agreeing)
    best = max(gcounts.values())
    grade = max((g for g, c in gcounts.items() if c == best), key=rubric.levels.index)
    return agreement, rubric.label(grade), grade


def label_pairs(
    items: Sequence[tuple[str, Sequence[str]]],
    judges: Sequence[Judge],
    rubric: Rubric = CMEDTEB_RUBRIC,
    policy: Policy = "unanimous",
    agreement_on: Literal["label", "grade"] = "label",
    *,
    max_passages_per_call: int = 20,
    show_progress: bool = True,
) -> ConsensusResult:
    """Grade every ``(query, passages)`` item with every judge (``max_passages_per_call`` passages of a query
    per call) and apply ``policy``; a wrong number of grades or one outside the rubric is a JudgeError."""
    if len(judges) < 2:
        raise ValueError("consensus labelling needs at least 2 judges")
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; valid policies: {', '.join(POLICIES)}")
    names: list[str] = []
    for i, j in enumerate(judges):
        name = judge_name(j, i)
        names.append(name if name not in names else f"{name}#{i}")
    pairs: list[LabeledPair] = []
    all_grades: list[list[str]] = []
    total = sum(len(p) for _, p in items)
    with progress(total=total, desc="labelling", unit="pair", disable=not show_progress) as bar:
        for query, passages in items:
            passages = list(passages)
            per_judge: list[list[str]] = []
            for name, judge in zip(names, judges):
                grades: list[str] = []
                for start in range(0, len(passages), max_passages_per_call):
                    chunk = passages[start : start + max_passages_per_call]
                    out = list(judge(query, chunk))
                    if len(out) != len(chunk):
                        raise JudgeError(f"judge {name} returned {len(out)} grades for {len(chunk)} passages")
                    grades.extend(str(g).strip().upper() for g in out)
                bad = [g for g in grades if g not in rubric.levels]
                if bad:
                    levels = ", ".join(rubric.levels)
                    raise JudgeError(f"judge {name} gave grade {bad[0]!r}, not one of {levels}")
                per_judge.append(grades)
            for k, passage in enumerate(passages):
                grades = [g[k] for g in per_judge]
                agreement, label, grade = decide(grades, rubric, policy, agreement_on)
                pairs.append(LabeledPair(query, passage, dict(zip(names, grades)), agreement, label, grade))
                all_grades.append(grades)
            bar.update(len(passages))
    if all_grades:
        kappa_g = fleiss_kappa(category_counts(all_grades, rubric.levels))
        labels = [[rubric.label(g) for g in row] for row in all_grades]
        kappa_l = fleiss_kappa(category_counts(labels, [0, 1]))
    else:
        kappa_g = kappa_l = float("nan")
    return ConsensusResult(pairs, names, policy, agreement_on, kappa_l, kappa_g)
