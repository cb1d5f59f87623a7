"""A checkpoint the file system refuses (a full disk, a file-size limit) is one ``cannot write checkpoint PATH:
REASON`` error, never a ``SafetensorError`` / ``RuntimeError`` traceback, and the previous checkpoint stays
byte-identical and loadable (issue 43, tracebacks from a full file system). Covers medadapt's one loop
(:func:`medadapt.training.checkpoint.save_checkpoint`), which every system trains through."""

from __future__ import annotations

import errno
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

import medadapt.training.checkpoint as ckpt
from medadapt.errors import MedAdaptError
from medadapt.training.checkpoint import (CheckpointConfig, CheckpointWriteError, load_checkpoint,
                                          save_checkpoint)

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "med-moe-embed-tiny.yaml"
QUIET = {"show_progress": False, "evaluate": False, "log": lambda _m: None}
FULL = OSError(errno.ENOSPC, "No space left on device")
#: what safetensors' Rust writer raises on a full disk
SAFE_FULL = SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                            'message: "No space left on device" })')


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _save(config: CheckpointConfig, step: int) -> Path:
    head = {"w": torch.full((4, 4), float(step))}
    return save_checkpoint(config, step, head, {"opt": {"step": torch.tensor(step)}}, {"step": step, "fingerprint": "f"})


def _raise(exc):
    def fail(*args, **kwargs):
        raise exc
    return fail


@pytest.mark.parametrize("writer, exc", [
    ("atomic_save_tensors", FULL),  # the head's safetensors file
    ("atomic_save_tensors", SAFE_FULL),
    ("atomic_save_tensors", MedAdaptError("cannot write /x/head.safetensors: No space left on device")),
    ("torch.save", RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0")),
    ("torch.save", FULL),
    ("write_sums", FULL),  # the SHA256SUMS, after every other file
])
def test_a_refused_write_is_one_error_and_the_previous_checkpoint_stays(writer, exc, tmp_path, monkeypatch):
    config = CheckpointConfig(tmp_path / "ckpts", keep=1)  # keep=1: pruning would remove step 2 after a save
    first = _save(config, 2)
    before = _snapshot(config.directory)
    if writer == "torch.save":
        monkeypatch.setattr(ckpt.torch, "save", _raise(exc))
    else:
        monkeypatch.setattr(ckpt, writer, _raise(exc))
    with pytest.raises(CheckpointWriteError) as err:
        _save(config, 4)
    message = str(err.value)
    assert message.startswith(f"cannot write checkpoint {config.directory / 'step-00000004'}: "), message
    assert "\n" not in message
    if exc is FULL or exc is SAFE_FULL or isinstance(exc, MedAdaptError):
        assert message.endswith(": No space left on device"), message
    assert _snapshot(config.directory) == before  # no temporary folder left, step 2 byte-identical
    assert load_checkpoint(first)[2]["step"] == 2


def test_a_real_file_size_limit_is_one_error(tmp_path):
    """No mock: a process whose file-size limit (RLIMIT_FSIZE) is below the head's size gets EFBIG from the
    kernel while writing the checkpoint."""
    script = textwrap.dedent(f"""
        import resource, signal, sys
        import torch
        from medadapt.training.checkpoint import CheckpointConfig, CheckpointWriteError, save_checkpoint
        config = CheckpointConfig({str(tmp_path / "ckpts")!r})
        save_checkpoint(config, 2, {{"w": torch.zeros(8)}}, {{}}, {{"step": 2}})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        try:
            save_checkpoint(config, 4, {{"w": torch.zeros(100_000)}}, {{}}, {{"step": 4}})
        except CheckpointWriteError as exc:
            print(exc)
            sys.exit(3)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert proc.stdout.strip() == f"cannot write checkpoint {tmp_path / 'ckpts' / 'step-00000004'}: File too large"
    assert sorted(p.name for p in (tmp_path / "ckpts").iterdir()) == ["step-00000002"]
    assert load_checkpoint(tmp_path / "ckpts" / "step-00000002")[2]["step"] == 2


def test_medadapt_train_on_a_full_disk_stops_with_one_error(tiny_bert_dir, tiny_beir_dir, tmp_path, monkeypatch):
    """Through a recipe (medadapt's loop): the second checkpoint's write fails; the run stops with the error,
    writes no model folder, and the first checkpoint is intact."""
    from medadapt.recipes import run_recipe

    calls = []
    save = ckpt.torch.save

    def full_on_the_second(obj, path, *a, **k):
        calls.append(path)
        if len(calls) == 2:
            raise FULL
        return save(obj, path, *a, **k)

    monkeypatch.setattr(ckpt.torch, "save", full_on_the_second)
    out = tmp_path / "run"
    overrides = [f"model.backbone={tiny_bert_dir}", f"data.path={tiny_beir_dir}", "data.hard_negatives=null",
                 "training.batch_size=4", "training.checkpoint_every_steps=2", "training.device=cpu"]
    with pytest.raises(CheckpointWriteError, match=r"cannot write checkpoint .*step-\d+: No space left on device"):
        run_recipe(RECIPE, out, overrides, **QUIET)
    assert not out.exists()
    kept = sorted(p.name for p in (tmp_path / "run.checkpoints").iterdir() if not p.name.endswith(".txt"))
    assert len(kept) == 1 and kept[0].startswith("step-"), kept
    assert load_checkpoint(tmp_path / "run.checkpoints" / kept[0])[2]["step"] == 2
