"""Neutral :class:`~medadapt.training.loop.Step` building blocks for any system's stages: :func:`embed`,
:class:`TextPairStep`, :class:`TextRows` / :class:`DatasetBatches` (lazy text tables, a one-table-per-batch
sampler), :class:`TowerWithLoss` and :func:`trainable_only`."""

from __future__ import annotations

import bisect
import contextlib
import hashlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from medadapt.errors import ConfigError
from medadapt.training.loop import Batch

__all__ = ["DatasetBatches", "TextPairStep", "TextRows", "TowerWithLoss", "embed", "trainable_only"]


def embed(model, texts: Sequence[str], task: str | None, *, run_model: nn.Module | None = None,
          max_length: int | None = None, prompt: str | None = None) -> Tensor:
    """Embed ``texts`` *with gradients* through ``run_model`` (``model``, or the engine the loop prepared);
    ``task`` picks the Router route and the prompt, an explicit ``prompt`` replaces the task's (``""``: none)."""
    if prompt is None:
        prompt = (model.prompts or {}).get(task) if task else None
    kwargs: dict[str, Any] = {"task": task} if task else {}
    if max_length is not None:
        kwargs["max_length"] = max_length
    features = model.preprocess(list(texts), prompt=prompt or None, **kwargs)
    device = next(model.parameters()).device
    features = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in features.items()}
    return (run_model or model)(features)["sentence_embedding"]


@contextlib.contextmanager
def trainable_only(model: nn.Module, params: Sequence[nn.Parameter]) -> Iterator[None]:
    """Within the block exactly ``params`` of ``model`` have ``requires_grad``; every flag is
    restored afterwards, also on error."""
    saved = [(p, p.requires_grad) for p in model.parameters()]
    wanted = {id(p) for p in params}
    try:
        for p in model.parameters():
            p.requires_grad_(id(p) in wanted)
        yield
    finally:
        for p, flag in saved:
            p.requires_grad_(flag)


class TowerWithLoss(nn.Module):
    """A tower and a loss with parameters (a learnable temperature) as one module, so the loop trains
    and checkpoints both; ``forward`` is the tower's."""

    def __init__(self, tower: nn.Module, loss: nn.Module) -> None:
        super().__init__()
        self.tower, self.loss = tower, loss

    def forward(self, features: dict[str, Any]) -> dict[str, Any]:
        return self.tower(features)


class TextPairStep:
    """Pairs ``(a, b)`` of texts -> ``loss(E(a), E(b))`` with in-batch negatives, both through one tower.

    ``tasks``: the :func:`embed` task of side ``a`` and of side ``b`` (prompt and Router route). Items may carry
    hard negatives ``(a, b, n_1, ..., n_k)``, embedded like ``b`` and passed as ``(B, k, d)``; ``k`` must be the
    same within a batch. ``prompts`` maps an item index to its prompts of ``a`` and of ``b`` (BMRetriever: the
    instructions of the item's data set)."""

    def __init__(self, tower, pairs: Sequence[tuple[str, ...]], loss: nn.Module, *,
                 max_length: int | None = None, tasks: tuple[str | None, str | None] = (None, None),
                 prompts: Callable[[int], tuple[str, str]] | None = None) -> None:
        self.tower, self.pairs, self.loss_fn, self.max_length = tower, pairs, loss, max_length
        self.tasks, self.prompts = tasks, prompts
        if isinstance(pairs, (list, tuple)):
            n = len(pairs[0]) if pairs else 2
            if n < 2 or any(len(p) != n for p in pairs):
                raise ConfigError("every text pair needs two texts and the same number of hard negatives")

    def _embed(self, texts: list[str], side: int, prompts: list[str] | None, run_model: nn.Module) -> Tensor:
        task = self.tasks[side]
        if prompts is None:
            return embed(self.tower, texts, task, run_model=run_model, max_length=self.max_length)
        groups: dict[str, list[int]] = {}
        for j, p in enumerate(prompts):
            groups.setdefault(p, []).append(j)
        if len(groups) == 1:
            return embed(self.tower, texts, task, run_model=run_model, max_length=self.max_length,
                         prompt=prompts[0])
        order = [j for rows in groups.values() for j in rows]
        parts = [embed(self.tower, [texts[j] for j in rows], task, run_model=run_model,
                       max_length=self.max_length, prompt=p) for p, rows in groups.items()]
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order)] = torch.arange(len(order))
        return torch.cat(parts)[inverse.to(parts[0].device)]

    def forward(self, run_model: nn.Module, batch: Batch) -> dict[str, Tensor]:
        items = [self.pairs[i] for i in batch.indices]
        width = len(items[0])
        if width < 2 or any(len(x) != width for x in items):
            raise ConfigError("every text pair of a batch needs two texts and the same number of hard negatives")
        pa = pb = None
        if self.prompts is not None:
            both = [self.prompts(i) for i in batch.indices]
            pa, pb = [p for p, _ in both], [p for _, p in both]
        out = {"a": self._embed([x[0] for x in items], 0, pa, run_model),
               "b": self._embed([x[1] for x in items], 1, pb, run_model)}
        if width > 2:
            n = self._embed([t for x in items for t in x[2:]], 1,
                            None if pb is None else [p for p in pb for _ in range(width - 2)], run_model)
            out["negatives"] = n.reshape(len(items), width - 2, -1)
        return out

    def loss(self, outputs: dict[str, Tensor], batch: Batch) -> dict[str, Tensor]:
        if "negatives" in outputs:
            return self.loss_fn(outputs["a"], outputs["b"], outputs["negatives"])
        return self.loss_fn(outputs["a"], outputs["b"])


# ------------------------------------------------------------------------------------------------ data
def _row(table, row: int) -> Any:
    """Row ``row`` of a ``datasets.Dataset`` (a dict) or of a dict of columns."""
    if isinstance(table, dict):
        return {c: values[row] for c, values in table.items()}
    return table[row]


def _length(table) -> int:
    return len(next(iter(table.values()))) if isinstance(table, dict) else len(table)


class TextRows(Sequence):
    """The items ``(c_1, ..., c_k)`` of tables laid end to end, table ``t`` giving its ``columns[t]``. Tables
    are ``datasets.Dataset`` (read a row at a time, never loaded whole) or dicts of lists."""

    def __init__(self, tables: Sequence[Any], columns: Sequence[Sequence[str]]) -> None:
        if len(tables) != len(columns):
            raise ValueError(f"{len(tables)} tables but {len(columns)} column lists")
        self.tables, self.columns = list(tables), [list(c) for c in columns]
        self.sizes = [_length(t) for t in self.tables]
        self.offsets = [0]
        for n in self.sizes:
            self.offsets.append(self.offsets[-1] + n)

    def __len__(self) -> int:
        return self.offsets[-1]

    def part(self, index: int) -> int:
        """The table that holds item ``index``."""
        return bisect.bisect_right(self.offsets, int(index)) - 1

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(index)
        t = self.part(index)
        row = _row(self.tables[t], index - self.offsets[t])
        return tuple(row[c] for c in self.columns[t])

    def keys(self, part: int, chunk: int = 10_000) -> np.ndarray:
        """``(rows, k)`` 64-bit BLAKE2b keys of table ``part``'s texts (equal texts, equal keys, in every
        process), for :class:`DatasetBatches`' duplicate check."""
        table, cols = self.tables[part], self.columns[part]
        out = np.empty((self.sizes[part], len(cols)), dtype=np.int64)
        for lo in range(0, self.sizes[part], chunk):
            hi = min(lo + chunk, self.sizes[part])
            block = {c: table[c][lo:hi] for c in cols} if isinstance(table, dict) else table[lo:hi]
            for j, c in enumerate(cols):
                out[lo:hi, j] = [int.from_bytes(hashlib.blake2b(str(t).encode(), digest_size=8).digest(), "little",
                                                signed=True) for t in block[c]]
        return out


class DatasetBatches:
    """The global batches of an epoch (``Stage.batches``) over tables laid end to end, as
    sentence-transformers' proportional sampler forms them: each batch from one table, each table cut into full
    batches (a smaller last one dropped), the tables' batches interleaved at random. With ``keys``
    (:meth:`TextRows.keys`) a batch never holds the same text twice (``NoDuplicatesBatchSampler``). Seeded by
    ``(seed, epoch, table)``: the same in every process and on resume."""

    def __init__(self, sizes: Sequence[int], batch_size: int, seed: int, *,
                 keys: Sequence[np.ndarray] | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if keys is not None and len(keys) != len(sizes):
            raise ValueError(f"{len(sizes)} tables but {len(keys)} key arrays")
        self.sizes, self.batch_size, self.seed, self.keys = list(sizes), batch_size, seed, keys
        self.offsets = np.cumsum([0, *self.sizes])
        self._cache: dict[int, list[list[int]]] = {}

    def _table(self, t: int, epoch: int) -> list[list[int]]:
        rng = np.random.default_rng((self.seed, epoch, t))
        order = rng.permutation(self.sizes[t])
        b, base = self.batch_size, int(self.offsets[t])
        if self.keys is None:
            full = len(order) // b * b
            return (order[:full].reshape(-1, b) + base).tolist()
        keys = self.keys[t]
        remaining = dict.fromkeys(order.tolist())
        out = []
        while len(remaining) >= b:
            batch: list[int] = []
            seen: set[int] = set()
            for row in remaining:
                texts = set(keys[row].tolist())
                if texts & seen:
                    continue
                batch.append(row)
                seen |= texts
                if len(batch) == b:
                    break
            if len(batch) < b:  # what is left cannot fill a batch without a duplicate
                break
            for row in batch:
                del remaining[row]
            out.append([row + base for row in batch])
        return out

    def __call__(self, epoch: int) -> list[list[int]]:
        if epoch not in self._cache:
            per_table = [self._table(t, epoch) for t in range(len(self.sizes))]
            which = np.repeat(np.arange(len(per_table)), [len(p) for p in per_table])
            which = which[np.random.default_rng((self.seed, epoch)).permutation(len(which))]
            cursors = [0] * len(per_table)
            plan = []
            for t in which.tolist():
                plan.append(per_table[t][cursors[t]])
                cursors[t] += 1
            self._cache[epoch] = plan
        return self._cache[epoch]
