"""Shared CLI helpers: one-line errors, the shared options, choices, quiet third-party logging, command bodies
imported when they run. Imports no torch: every command's ``--help`` reads its options from here."""

from __future__ import annotations

import enum
import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer

from medadapt.backends import check_backend, require_backend
from medadapt.cli._console import console, err_console, tagged
from medadapt.errors import MedAdaptError, MedAdaptWarning
from medadapt.progress import level, set_level

__all__ = ["console", "err_console", "tagged", "fail", "user_errors", "quiet_libraries", "body", "choices",
           "DeviceOpt", "QuietOpt", "VerboseOpt", "CACHE_DEFAULT", "CacheDirOpt", "BackendOption",
           "check_backend_option", "PaperOpt", "SetOpt", "Rerank", "RerankOpt", "RerankWeightOpt", "RerankDepthOpt",
           "RerankDomainWeightsOpt", "parse_domain_weights", "rerank_options"]


def choices(name: str, *values: str) -> type[enum.Enum]:
    """An option's choices as a ``str`` enum (Typer shows and checks its values); ``-`` in a member name is ``_``."""
    return enum.Enum(name, {value.replace("-", "_"): value for value in values}, type=str)


def body(module: str, name: str):
    """A command's body, ``name`` of ``module``, imported only now that the command runs: its signature (all its
    ``--help`` reads) stays in a module that imports no torch."""
    return getattr(importlib.import_module(module), name)


#: ``medadapt eval``'s choices that its body compares too (its options: :mod:`medadapt.cli.eval`).
Mode = choices("Mode", "dense", "lexical", "hybrid")  # which side of a model or index retrieval uses
Instructions = choices("Instructions", "auto", "on", "off")  # suites: the papers' instructions (auto: if aware)
Task = choices("Task", "retrieval", "rerank", "sts", "qa", "entity-linking", "recommendation")
Rerank = choices("Rerank", "maxsim")  # a second retrieval stage (medadapt.retrieval.late)
RerankOpt = Annotated[Optional[Rerank], typer.Option(
    help="Re-rank the first stage's results: maxsim (late interaction over the model's own token embeddings, "
         "fused with the first-stage scores; no training; docs/retrieval.md).")]
RerankWeightOpt = Annotated[Optional[float], typer.Option(
    help="--rerank: MaxSim's share of the fused score, 0 to 1 (default 0.7; 0 keeps the first-stage order).")]
RerankDepthOpt = Annotated[Optional[int], typer.Option(
    help="--rerank: first-stage documents re-ranked per query (default 100).")]
RerankDomainWeightsOpt = Annotated[Optional[str], typer.Option(
    help="--rerank: MaxSim's share per domain instead of --rerank-weight, e.g. medquad=0,questiondoctors=0.7; "
         "each query's weight mixes them by the model's own domain classifier (a model trained with domain "
         "routing; one weight per domain it knows).")]

#: ``--device`` of every command that loads a model.
DeviceOpt = Annotated[Optional[str], typer.Option(help="cpu, cuda, mps ... (default: auto).")]


def _quiet_flag(value: bool) -> bool:
    if value:
        set_level("quiet")
    return value


def _verbose_flag(value: bool) -> bool:
    if value:
        if level() != "quiet":  # --quiet wins over --verbose
            set_level("verbose")
    return value


#: ``--quiet`` / ``--verbose`` of every command with long steps (they set :mod:`medadapt.progress`'s level).
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", callback=_quiet_flag, help="No progress bars.")]
VerboseOpt = Annotated[bool, typer.Option(
    "--verbose", "-v", callback=_verbose_flag,
    help="Also show the libraries' own logs, warnings and progress bars (transformers, sentence-transformers, "
         "datasets, huggingface_hub).")]


def quiet_libraries() -> None:
    """Silence third-party warnings, logs and progress bars (medadapt's own progress stays); not with ``--verbose``."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if level() == "verbose":
        return
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    warnings.filterwarnings("default", category=MedAdaptWarning)  # medadapt's own recoveries stay visible
    for name in ("sentence_transformers", "accelerate", "datasets", "faiss", "jieba", "mteb"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from datasets.utils.logging import disable_progress_bar  # after the filters, as before: no import warnings
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    disable_progress_bars()  # "Loading weights" / "Fetching files" bars of the hub client
    disable_progress_bar()


def fail(message: str) -> None:
    """Print ``error: message`` on one stderr line and exit with code 1 (no traceback)."""
    err_console.print(tagged("error:", "bold red", message), highlight=False, soft_wrap=True)  # [onnx] stays
    raise typer.Exit(code=1)


@contextmanager
def user_errors(interrupted: str = "interrupted") -> Iterator[None]:
    """Run a command body; a :class:`~medadapt.errors.MedAdaptError`, a file system error or Ctrl-C becomes
    one ``error: ...`` line (:func:`fail`)."""
    try:
        yield
    except MedAdaptError as exc:
        fail(str(exc))
    except OSError as exc:  # a file system error the steps did not turn into a MedAdaptError
        fail(f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}")
    except KeyboardInterrupt:
        fail(interrupted)


#: ``--paper`` and ``--set`` of ``medadapt train`` and ``medadapt plan``.
PaperOpt = Annotated[bool, typer.Option("--paper", help="Apply the paper's equations and hyperparameters (the "
                                        "system's paper settings, docs/recipes.md) on top of the recipe; --set "
                                        "still wins.")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Override a recipe field: section.field=value "
                                                     "(repeatable).")]

#: Where the embedding cache lives unless ``--cache-dir`` says otherwise
#: (:func:`medadapt.cache.default_cache_dir`; every command's help shows it the same way).
CACHE_DEFAULT = "$MEDADAPT_CACHE, else ~/.cache/medadapt/embeddings"
#: ``--cache-dir`` of every command that encodes through the embedding cache.
CacheDirOpt = Annotated[Optional[Path], typer.Option(
    "--cache-dir", help=f"Embedding cache folder (default: {CACHE_DEFAULT}).")]


#: ``--backend`` of ``medadapt eval`` / ``index`` / ``search`` (checked by :func:`check_backend_option`).
BackendOption = Annotated[str, typer.Option(
    "--backend", help="Encoder runtime: torch, onnx, onnx-int8 (int8 weights) or openvino; the non-torch ones "
                      "run on the CPU, are exported once per model and cached apart (extras: "
                      "medadapt[onnx], medadapt[openvino]).")]


def check_backend_option(backend: str, **unsupported: bool) -> None:
    """Check ``--backend`` before any data or model is read: an unknown name, a missing package, or a non-torch
    backend with an option that does not support it (``**{"--suite": suite is not None}``) is one error."""
    if check_backend(backend) == "torch":
        return
    require_backend(backend)
    for flag, used in unsupported.items():
        if used:
            raise MedAdaptError(f"--backend {backend} does not apply to {flag} (use --backend torch)")


def parse_domain_weights(value: str) -> dict[str, float]:
    """``--rerank-domain-weights NAME=WEIGHT,...`` as ``{name: weight}``; a malformed value is one
    :class:`MedAdaptError` (the range is :class:`~medadapt.retrieval.late.MaxSimConfig`'s to check)."""
    out: dict[str, float] = {}
    usage = "--rerank-domain-weights takes NAME=WEIGHT pairs separated by commas (e.g. medquad=0,questiondoctors=0.7)"
    for part in value.split(","):
        name, sep, number = (x.strip() for x in part.partition("="))
        if not sep or not name:
            raise MedAdaptError(f"{usage}; got {part.strip()!r}")
        try:
            weight = float(number)
        except ValueError:
            raise MedAdaptError(f"{usage}; {name}'s weight {number!r} is not a number") from None
        if name in out:
            raise MedAdaptError(f"--rerank-domain-weights names {name!r} twice")
        out[name] = weight
    return out


def rerank_options(rerank, weight: float | None, depth: int | None, domain_weights: str | None = None
                   ) -> dict | None:
    """``--rerank`` / ``--rerank-weight`` / ``--rerank-depth`` / ``--rerank-domain-weights`` as the options of a
    MaxSim re-ranker (``None`` without ``--rerank``); any of them without it, or both weights, is one
    :class:`MedAdaptError`."""
    if rerank is None:
        if weight is not None or depth is not None:
            raise MedAdaptError("--rerank-weight / --rerank-depth apply with --rerank maxsim")
        if domain_weights is not None:
            raise MedAdaptError("--rerank-domain-weights applies with --rerank maxsim")
        return None
    if weight is not None and domain_weights is not None:
        raise MedAdaptError("--rerank-weight and --rerank-domain-weights: give one (one weight for every query, or "
                            "one per domain)")
    options = {k: v for k, v in (("weight", weight), ("depth", depth)) if v is not None}
    if domain_weights is not None:
        options["domain_weights"] = parse_domain_weights(domain_weights)
    return options
