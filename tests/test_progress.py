"""One progress system: medadapt's bars share one rich display on stderr, --quiet / --verbose set one level."""

from __future__ import annotations

import pytest

import medadapt.progress as prog
from medadapt.progress import Bar, progress, set_level


@pytest.fixture(autouse=True)
def _normal_level():
    set_level("normal")
    yield
    set_level("normal")
    assert prog._USERS == 0 and prog._SHARED is None, "a bar was left open"


def test_bar_counts_iterates_and_releases_the_display():
    seen = list(progress(range(7), desc="counting", unit="x"))
    assert seen == list(range(7))
    with progress(total=10, desc="manual") as bar:
        assert prog._USERS == 1 and prog._SHARED is not None
        bar.update(4)
        bar.update(3)
        assert bar.n == 7
        task = prog._SHARED.tasks[-1]
        assert (task.completed, task.total, task.description) == (7, 10, "manual")
    assert prog._SHARED is None  # the last bar stopped the display


def test_two_bars_share_one_display_on_stderr():
    a, b = Bar(total=3, desc="a"), Bar(total=5, desc="b")
    try:
        assert prog._USERS == 2
        assert [t.description for t in prog._SHARED.tasks] == ["a", "b"]
        assert prog._SHARED.console.stderr  # stdout stays clean for data (TREC runs, JSON)
    finally:
        a.close()
        a.close()  # idempotent
        b.close()


def test_quiet_level_and_disable_draw_nothing():
    set_level("quiet")
    bar = Bar(total=3, desc="hidden")
    bar.update(3)
    assert bar.n == 3 and prog._SHARED is None
    bar.close()
    set_level("normal")
    assert list(progress([1, 2], disable=True)) == [1, 2] and prog._SHARED is None


def test_bad_level_is_refused():
    with pytest.raises(ValueError, match="quiet, normal or verbose"):
        set_level("loud")


def test_training_bar_follows_the_global_step():
    from medadapt.training.progress import StepProgress

    bar = StepProgress()
    bar("shared", 1, 4, {"loss": 1.5, "infonce": 1.2, "load_balance": 0.3})
    bar("routed", 3, 4, {"loss": 0.9})
    task = prog._SHARED.tasks[-1]
    assert (task.completed, task.total, task.description) == (3, 4, "training (routed)")
    assert task.fields["info"] == "loss 0.9000"
    bar.close()


@pytest.mark.parametrize("flags, expected", [([], "normal"), (["--quiet"], "quiet"), (["--verbose"], "verbose"),
                                             (["-q", "-v"], "quiet")])
def test_cli_flags_set_the_level_and_each_command_starts_from_normal(flags, expected, monkeypatch):
    """``medadapt encode`` stands in for every command with long steps: the level is read inside the command."""
    from typer.testing import CliRunner

    import medadapt.cli._encode_run as encode_cli
    from medadapt.cli import app

    seen = {}

    def stop(*args, **kwargs):
        seen["level"] = prog.level()
        raise SystemExit(0)

    monkeypatch.setattr(encode_cli, "quiet_libraries", stop)
    set_level("quiet")  # left over from an earlier command in the same process
    CliRunner().invoke(app, ["encode", "--corpus", "medmini", *flags])
    assert seen["level"] == expected


def test_quiet_libraries_silences_library_bars_unless_verbose():
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging as hf_logging

    from medadapt.cli._common import quiet_libraries

    enable_progress_bars()
    hf_logging.enable_progress_bar()
    try:
        set_level("verbose")
        quiet_libraries()
        assert not are_progress_bars_disabled() and hf_logging.is_progress_bar_enabled()
        set_level("normal")
        quiet_libraries()
        assert are_progress_bars_disabled() and not hf_logging.is_progress_bar_enabled()
    finally:
        enable_progress_bars()
        hf_logging.enable_progress_bar()


def test_bars_never_write_to_stdout(capsys):
    for _ in progress(range(3), desc="x"):
        pass
    assert capsys.readouterr().out == ""


def test_encode_with_progress_matches_one_call_and_draws_a_medadapt_bar(monkeypatch):
    import numpy as np
    import torch

    from medadapt.progress import encode_with_progress

    calls = []

    def fake_encode(texts, batch_size, show_progress_bar, convert_to_tensor=False):
        calls.append((len(texts), show_progress_bar))
        out = np.array([[len(t), i] for i, t in enumerate(texts)], dtype=np.float32)
        return torch.from_numpy(out) if convert_to_tensor else out

    texts = [f"text {i}" * (i % 5 + 1) for i in range(70)]
    one = encode_with_progress(fake_encode, texts, batch_size=2, show_progress=False)
    assert calls == [(70, False)]  # no bar asked: one call, exactly as before
    calls.clear()
    started = []
    real = prog.shared_progress
    monkeypatch.setattr(prog, "shared_progress", lambda: started.append(1) or real())
    chunked = encode_with_progress(fake_encode, texts, batch_size=2, show_progress=True, convert_to_tensor=True)
    assert calls == [(32, False), (32, False), (6, False)]  # never sentence-transformers' own bar
    assert started == [1] and isinstance(chunked, torch.Tensor)
    np.testing.assert_array_equal(chunked[:, 0].numpy(), one[:, 0])
