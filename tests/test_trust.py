"""Fault injection: files, folders and untrusted input (docs/guarantees.md).

Each test breaks something on purpose (a crash in the middle of a save, a reader racing a writer, a hostile
or damaged file) and checks that medadapt gives the old or the new state, or one clear error, never a mix
or a silent wrong number.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from _helpers import loop_run
from conftest import run_cli, run_cli_processes
from medadapt import io as mio

# ---------------------------------------------------------------- files and folders


@pytest.mark.parametrize("umask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_files_get_the_users_usual_mode(tmp_path, umask, expected):
    old = os.umask(umask)
    try:
        mio.atomic_write_text(tmp_path / "a.txt", "x")
        with open(tmp_path / "plain.txt", "w") as f:  # what any other tool would create
            f.write("x")
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == expected
    assert (tmp_path / "plain.txt").stat().st_mode & 0o777 == expected


def _modes(folder: Path) -> dict[str, int]:
    return {p.relative_to(folder).as_posix(): p.stat().st_mode & 0o777 for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_saved_folders_get_the_users_usual_mode(tmp_path, tiny_bert_dir, umask):
    """Every file of an adapter folder (weights included: safetensors' own ``save_file`` creates 0600 files)
    and of a full model folder swapped in by replace_folder (``save_pretrained`` writes through safetensors)
    gets the mode a plain ``open()`` gives under the current umask."""
    from sentence_transformers import SentenceTransformer

    from medadapt.adapters.files import ADAPTER_WEIGHTS, save_adapter
    from medadapt.moe import MoEConfig

    model = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    model.add_adapter(MoEConfig.paper(dim=model.get_embedding_dimension(), expansion=2), adapter_name="med")
    old = os.umask(umask)
    try:
        with open(tmp_path / "plain.txt", "w") as f:
            f.write("x")
        expected = (tmp_path / "plain.txt").stat().st_mode & 0o777
        save_adapter(model, tmp_path / "adapter")
        with mio.replace_folder(tmp_path / "full") as tmp:
            model.save(str(tmp))
    finally:
        os.umask(old)
    assert expected == 0o666 & ~umask
    for folder, must in [(tmp_path / "adapter", ADAPTER_WEIGHTS), (tmp_path / "full", "model.safetensors")]:
        modes = _modes(folder)
        assert must in modes and len(modes) > 3
        assert modes == {name: expected for name in modes}, folder


def _write_version(folder: Path, version: int, n_files: int = 4) -> None:
    for i in range(n_files):
        (folder / f"part-{i}.txt").write_text(str(version))
    (folder / "manifest.txt").write_text(str(version))


def test_replace_folder_never_shows_a_reader_no_folder_or_a_mix(tmp_path):
    """At every instant the path holds the old or the new folder (one ``renameat2`` exchange). A reader that
    spans a swap notices it the way medadapt's loaders do (the manifest read again after the files differs)
    and reads again; what it accepts is never a mix, and it never finds no folder."""
    target = tmp_path / "model"
    with mio.replace_folder(target) as tmp:
        _write_version(tmp, 0)
    stop, problems, reads, retries = threading.Event(), [], [0], [0]

    def reader():
        while not stop.is_set():
            try:
                before = (target / "manifest.txt").read_text()
                versions = {(target / f"part-{i}.txt").read_text() for i in range(4)}
                after = (target / "manifest.txt").read_text()
            except FileNotFoundError as exc:  # the old folder renamed away before the new one arrived
                problems.append(f"missing: {exc.filename}")
                continue
            if before != after:
                retries[0] += 1
                continue
            if versions != {before}:
                problems.append(f"mix: {sorted(versions)} under manifest {before}")
            reads[0] += 1

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for version in range(1, 300):
            with mio.replace_folder(target) as tmp:
                _write_version(tmp, version)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert reads[0] > 0
    assert not problems, problems[:5]
    assert (target / "part-0.txt").read_text() == "299"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # nothing left beside it


def test_a_failure_inside_replace_folder_keeps_the_old_folder(tmp_path):
    target = tmp_path / "run"
    with mio.replace_folder(target) as tmp:
        _write_version(tmp, 1)
    with pytest.raises(RuntimeError), mio.replace_folder(target) as tmp:
        _write_version(tmp, 2, n_files=2)
        raise RuntimeError("disk full")
    assert {p.read_text() for p in target.iterdir()} == {"1"} and len(list(target.iterdir())) == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_process_killed_while_writing_leaves_the_old_folder_and_its_leftover_is_cleaned(tmp_path):
    target = tmp_path / "run"
    with mio.replace_folder(target) as tmp:
        _write_version(tmp, 1)
    code = ("import os, sys; from medadapt import io\n"
            f"with io.replace_folder({str(target)!r}) as tmp:\n"
            "    (tmp / 'part-0.txt').write_text('2')\n"
            "    os.kill(os.getpid(), 9)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert proc.returncode == -9
    leftovers = [p for p in tmp_path.iterdir() if p.name != "run"]
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".run.tmp-")
    assert {p.read_text() for p in target.iterdir()} == {"1"}
    with mio.replace_folder(target) as tmp:  # the next save cleans the dead writer's folder
        _write_version(tmp, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_live_writers_temporary_folder_is_not_cleaned(tmp_path):
    target = tmp_path / "run"
    live = tmp_path / f".run.tmp-{os.getppid()}-abcd1234"  # a running process's (our parent's) folder
    live.mkdir()
    dead = tmp_path / f".run.tmp-{_dead_pid()}-abcd1234"
    dead.mkdir()
    mio.clean_leftovers(target)
    assert live.exists() and not dead.exists()


def test_fallback_crash_between_renames_is_repaired(tmp_path, monkeypatch):
    """Where no atomic exchange exists, the old folder is renamed away first; a crash right then leaves
    ``.<name>.old-*`` and no target: the next writer (or reader through clean_leftovers) puts it back."""
    target = tmp_path / "index"
    monkeypatch.setattr(mio, "_exchange", lambda a, b: False)
    with mio.replace_folder(target) as tmp:
        _write_version(tmp, 1)
    with mio.replace_folder(target) as tmp:  # the fallback path works end to end
        _write_version(tmp, 2)
    assert {p.read_text() for p in target.iterdir()} == {"2"}
    os.replace(target, tmp_path / f".index.old-{_dead_pid()}-abcd1234")  # the crash, frozen in time
    mio.clean_leftovers(target)
    assert {p.read_text() for p in target.iterdir()} == {"2"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]


# ---------------------------------------------------------------- training: resume, checkpoints, non-finite


def _loop_run(tmp_path, optim, **kwargs):
    return loop_run(optim, dropout=0.1, **kwargs)


def _killed_at_step_5(tmp_path):
    """A run killed at step 5 of 12 with checkpoints every 2 steps (kept: step 2 and step 4)."""
    from medadapt.training.checkpoint import CheckpointConfig
    from medadapt.training.config import OptimSection

    optim = OptimSection(batch_size=8, lr=1e-2, epochs=3, warmup_ratio=0.1)

    class Stop(Exception):
        pass

    def kill(stage, step, total, row):
        if step == 5:
            raise Stop

    ckpt = CheckpointConfig(tmp_path / "ck", every_steps=2)
    with pytest.raises(Stop):
        _loop_run(tmp_path, optim, checkpoint=ckpt, fingerprint="run-a", progress=kill)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-00000002", "step-00000004"]
    return optim, ckpt


@pytest.mark.parametrize("damage", ["truncate-head", "flip-optimizer-byte", "garbage-state", "edit-state-step",
                                    "drop-a-sum", "no-sums"])
def test_an_unreadable_checkpoint_falls_back_to_the_previous_one_and_the_run_stays_the_same(tmp_path, damage):
    import torch

    from medadapt.errors import MedAdaptWarning

    optim, ckpt = _killed_at_step_5(tmp_path)
    newest = tmp_path / "ck" / "step-00000004"
    if damage == "truncate-head":
        f = newest / "head.safetensors"
        f.write_bytes(f.read_bytes()[:-10])
    elif damage == "flip-optimizer-byte":  # same size, one bit: only the checksum can tell
        f = newest / "optimizer.pt"
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x01
        f.write_bytes(bytes(data))
    elif damage == "garbage-state":
        (newest / "state.json").write_text("{not json")
    elif damage == "edit-state-step":  # valid JSON, another step: a resume from it would not be the same run
        import json

        state = json.loads((newest / "state.json").read_text())
        (newest / "state.json").write_text(json.dumps({**state, "step": state["step"] + 2}))
    elif damage == "drop-a-sum":  # the sums file loses the head's line: the head would go unchecked
        sums = newest / "SHA256SUMS"
        sums.write_text("".join(ln + "\n" for ln in sums.read_text().splitlines() if "head" not in ln))
    else:
        (newest / "SHA256SUMS").unlink()
    whole, res_whole = _loop_run(tmp_path, optim)
    with pytest.warns(MedAdaptWarning, match="step-00000004.*resuming from the one before"):
        resumed, res = _loop_run(tmp_path, optim, checkpoint=ckpt, fingerprint="run-a")
    for a, b in zip(whole.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert [r["loss"] for r in res.loss_history] == [r["loss"] for r in res_whole.loss_history]


def test_no_readable_checkpoint_is_one_clear_error(tmp_path):
    from medadapt.training.loop import TrainingError

    optim, ckpt = _killed_at_step_5(tmp_path)
    for step in ("step-00000002", "step-00000004"):
        f = tmp_path / "ck" / step / "head.safetensors"
        f.write_bytes(b"\0" * 16)
    with pytest.warns(Warning), pytest.raises(TrainingError, match="no checkpoint .* can be read.*--overwrite"):
        _loop_run(tmp_path, optim, checkpoint=ckpt, fingerprint="run-a")


def test_parameters_that_become_non_finite_stop_training_and_save_nothing(tmp_path):
    """A finite loss with a NaN gradient (|w| at w = 0): the step's loss passes the loss check, the weights
    after it are NaN; training stops and nothing reaches a checkpoint."""
    import torch
    from torch import nn

    from medadapt.training.checkpoint import CheckpointConfig
    from medadapt.training.config import OptimSection
    from medadapt.training.loop import Stage, TrainingError, train

    class NormStep:
        def forward(self, model, batch):
            return {"norm": torch.sqrt((model.weight ** 2).sum()).reshape(1)}

        def loss(self, out, batch):
            return {"norm": out["norm"].sum()}

    model = nn.Linear(4, 4)
    with torch.no_grad():
        model.weight.zero_()
    optim = OptimSection(batch_size=8, lr=1e-2, epochs=1, warmup_ratio=0.0, max_grad_norm=None)
    with pytest.raises(TrainingError, match="non-finite"):
        train(model, [Stage("main", 8, NormStep(), [model.weight], optim)],
              checkpoint=CheckpointConfig(tmp_path / "ck"))
    assert not any((tmp_path / "ck").glob("step-*"))


def test_absurd_learning_rates_are_refused():
    from pydantic import ValidationError

    from medadapt.training.config import OptimSection

    for lr in (1e39, 1e308, 100.0):
        with pytest.raises(ValidationError, match="lr"):
            OptimSection(lr=lr)


def test_moe_config_refuses_non_finite_numbers():
    from medadapt.errors import ConfigError
    from medadapt.moe import MoEConfig

    for field in ("alpha_init", "residual_scale"):
        with pytest.raises(ConfigError, match=f"{field} must be a finite number"):
            MoEConfig.single_expert(32, "mlp_gelu", **{field: float("nan")})


def test_resume_refuses_a_base_model_folder_replaced_by_other_weights(tiny_beir_dir, tmp_path, monkeypatch):
    """Same recipe, same path, other weights at that path: the old head must not be kept."""
    from conftest import build_tiny_bert

    from medadapt.recipes import load_recipe, run_recipe
    from medadapt.training import TrainingError

    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    recipe_file = Path(__file__).resolve().parents[1] / "recipes" / "med-moe-embed-tiny.yaml"
    bert = build_tiny_bert(tmp_path / "bert", seed=0)
    root = tmp_path / "bert"
    sets = [f"model.backbone={bert}", f"data.path={tiny_beir_dir}", "data.hard_negatives.window=[2, 6]",
            "training.epochs=1", "training.checkpoint_every_steps=2"]
    out = tmp_path / "run"
    run_recipe(load_recipe(recipe_file, sets), out, show_progress=False, evaluate=False, log=lambda m: None)
    import shutil

    shutil.rmtree(root)
    assert build_tiny_bert(root, seed=1) == bert  # rebuilt in place: same name, other weights
    with pytest.raises(TrainingError, match="another run"):
        run_recipe(load_recipe(recipe_file, sets), out, show_progress=False, evaluate=False, log=lambda m: None)


# ---------------------------------------------------------------- through the command line


def _cli(args, env_extra, tmp_path, process: bool = False):
    """``medadapt ARGS`` through the CLI's entry point in this process (:func:`conftest.run_cli`), or in a real
    ``python -m medadapt`` process (``process=True``: the recovery test's second run, this file's one)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **env_extra}
    return run_cli_processes([args], env, tmp_path)[0] if process else run_cli(args, env, tmp_path)


def test_cli_shows_a_recovery_as_one_warning_line_and_gives_the_same_numbers(tiny_bert_dir, tiny_beir_dir,
                                                                            tmp_path):
    """A truncated cache shard: the eval still succeeds with the same numbers, and says what it repaired
    (the CLI silences third-party warnings, never medadapt's own)."""
    import json

    cache = tmp_path / "cache"
    args = ["eval", "--model", str(tiny_bert_dir), "--data", str(tiny_beir_dir), "--split", "test", "-q"]
    first = _cli([*args, "--output", str(tmp_path / "a.json")], {"MEDADAPT_CACHE": str(cache)}, tmp_path)
    assert first.returncode == 0, first.stderr
    assert "warning:" not in first.stderr
    shard = sorted(cache.rglob("shard-*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-7])
    second = _cli([*args, "--output", str(tmp_path / "b.json")], {"MEDADAPT_CACHE": str(cache)}, tmp_path,
                  process=True)
    assert second.returncode == 0, second.stderr
    warnings = [ln for ln in second.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "corrupt" in warnings[0] and "Traceback" not in second.stderr
    a, b = (json.loads((tmp_path / n).read_text()) for n in ("a.json", "b.json"))
    assert a.get("metrics", a) == b.get("metrics", b)


def test_ids_that_would_forge_trec_lines_never_reach_a_run_file(tmp_path):
    """Loaders refuse such ids (tests/test_trust_data.py); the Python API's Documents does too, and
    ``medadapt search`` refuses a tag that would split a line."""
    from medadapt.errors import DataError
    from medadapt.retrieval import Documents, Retriever

    with pytest.raises(DataError, match="document id 'bad id' contains whitespace"):
        Documents(["ok", "bad id"], ["a text", "another text"])
    docs = Documents(["d1", "d2"], ["gout is arthritis", "asthma needs an inhaler"])
    Retriever.build(docs, kind="lexical").save(tmp_path / "index")
    (tmp_path / "q.tsv").write_text("q1\tgout\n")
    proc = _cli(["search", "--index", str(tmp_path / "index"), "--queries", str(tmp_path / "q.tsv"), "--tag",
                 "my run", "--output", str(tmp_path / "run.txt")], {"MEDADAPT_CACHE": str(tmp_path / "c")},
                tmp_path)
    assert proc.returncode == 1 and "--tag 'my run' contains whitespace" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run.txt").exists()
