"""The loop's promises on the runs that train through sentence-transformers' trainer (a Med-MoE-Embed recipe
with a trained backbone; BMRetriever's stages use the same guard, :mod:`medadapt.training.guards`): a
non-finite loss stops training and writes nothing, checkpoints carry ``SHA256SUMS``, a damaged checkpoint
is skipped and the resumed run equals the uninterrupted one, and no checkpoint at all is one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "med-moe-embed-tiny.yaml"
QUIET = {"show_progress": False, "evaluate": False, "log": lambda _m: None}


def _overrides(bert, beir, *extra):
    return [f"model.backbone={bert}", f"data.path={beir}", "data.hard_negatives=null",
            "model.freeze_backbone=false", "head={kind: none}", "training.shared_epochs=0",
            "training.random_routing_epochs=0", "loss.load_balance_weight=0", "training.epochs=2",
            "training.batch_size=4", "training.checkpoint_every_steps=2", "training.device=cpu", *extra]


@pytest.fixture(scope="module")
def finished(tiny_bert_dir, tmp_path_factory):
    """One finished run with checkpoints 4 and 6, shared: ``(root, overrides, its model's weights)``."""
    from conftest import build_tiny_beir
    from medadapt.recipes import run_recipe

    root = tmp_path_factory.mktemp("trainer")
    overrides = _overrides(tiny_bert_dir, build_tiny_beir(root / "beir"))
    run_recipe(RECIPE, root / "run", overrides, **QUIET)
    return root, overrides, _weights(root / "run")


def _copy_of(finished, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the finished run and its checkpoints (same data, so the same run fingerprint)."""
    import shutil

    root = finished[0]
    shutil.copytree(root / "run", tmp_path / "run")
    shutil.copytree(root / "run.checkpoints", tmp_path / "run.checkpoints")
    return tmp_path / "run", tmp_path / "run.checkpoints"


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(folder.rglob("model.safetensors")) for k, v in load_file(str(f)).items()}


def test_a_non_finite_loss_stops_the_trainer_and_writes_nothing(tiny_bert_dir, tiny_beir_dir, tmp_path,
                                                                monkeypatch):
    from sentence_transformers.sentence_transformer import losses

    from medadapt.recipes import run_recipe
    from medadapt.training import TrainingError

    forward = losses.MultipleNegativesRankingLoss.forward
    calls = []

    def nan_at_the_third_step(self, *args, **kwargs):
        calls.append(1)
        loss = forward(self, *args, **kwargs)
        return loss * float("nan") if len(calls) == 3 else loss

    monkeypatch.setattr(losses.MultipleNegativesRankingLoss, "forward", nan_at_the_third_step)
    out = tmp_path / "run"
    with pytest.raises(TrainingError, match="loss is not finite"):
        run_recipe(RECIPE, out, _overrides(tiny_bert_dir, tiny_beir_dir), **QUIET)
    assert not out.exists()  # no model folder
    checkpoints = sorted(p.name for p in (tmp_path / "run.checkpoints").glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-2"]  # written before the NaN step; the NaN step reached no optimiser
    assert len(calls) == 3


def test_trainer_checkpoints_are_summed_and_a_damaged_one_is_skipped(finished, tmp_path):
    from medadapt.checksums import verify_sums
    from medadapt.errors import MedAdaptWarning
    from medadapt.recipes import run_recipe
    from medadapt.training import TrainingError

    _, overrides, expected = finished
    out, ckpt = _copy_of(finished, tmp_path)
    found = sorted(ckpt.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert [p.name for p in found] == ["checkpoint-4", "checkpoint-6"]  # save_total_limit=2
    for folder in found:
        verify_sums(folder, complete=True)  # every file listed and intact
    newest = found[-1] / "model.safetensors"
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated: the rerun must not read it
    with pytest.warns(MedAdaptWarning, match="checkpoint-6: .*resuming from an earlier one"):
        run_recipe(RECIPE, out, overrides, **QUIET)  # resumes from checkpoint-4
    resumed = _weights(out)
    assert resumed.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(resumed[name], value, atol=1e-6, rtol=0)  # the same run
    for folder in ckpt.glob("checkpoint-*"):  # every checkpoint damaged (sums intact): nothing to resume
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.warns(MedAdaptWarning), pytest.raises(TrainingError, match="no checkpoint .* intact.*--overwrite"):
        run_recipe(RECIPE, out, overrides, **QUIET)


@pytest.mark.parametrize("unsummed", ["newest", "all"])
def test_a_trainer_checkpoint_whose_save_did_not_finish_is_set_aside(finished, tmp_path, unsummed):
    """The trainer writes ``checkpoint-N`` in place and the sums come last: a kill in between leaves a folder
    without ``SHA256SUMS``. It is moved aside (the trainer would save into it again, over stale files) and
    the run resumes from the one before, or starts afresh; either way it ends as the uninterrupted run."""
    from medadapt.errors import MedAdaptWarning
    from medadapt.recipes import run_recipe

    _, overrides, expected = finished
    out, ckpt = _copy_of(finished, tmp_path)
    names = ["checkpoint-6"] if unsummed == "newest" else ["checkpoint-4", "checkpoint-6"]
    for name in names:
        (ckpt / name / "SHA256SUMS").unlink()
    with pytest.warns(MedAdaptWarning, match="checkpoint-6 has no SHA256SUMS .*set aside"):
        run_recipe(RECIPE, out, overrides, **QUIET)
    assert all((ckpt / f"incomplete-{name}").is_dir() for name in names)
    resumed = _weights(out)
    for name, value in expected.items():
        torch.testing.assert_close(resumed[name], value, atol=1e-6, rtol=0)


def test_trainer_checkpoints_without_the_run_mark_are_nobodys(tiny_bert_dir, tiny_beir_dir, tmp_path):
    """Checkpoints whose ``fingerprint.txt`` is gone cannot be shown to belong to this run: refused."""
    from medadapt.errors import ConfigError
    from medadapt.recipes import run_recipe

    overrides = _overrides(tiny_bert_dir, tiny_beir_dir, "training.epochs=1")
    run_recipe(RECIPE, tmp_path / "run", overrides, **QUIET)
    (tmp_path / "run.checkpoints" / "fingerprint.txt").unlink()
    with pytest.raises(ConfigError, match="belong to another run"):
        run_recipe(RECIPE, tmp_path / "run", overrides, **QUIET)


def test_non_finite_parameters_are_never_saved(tiny_bert_dir, tiny_beir_dir, tmp_path, monkeypatch):
    """Whatever loop a system uses, ``medadapt train`` checks the returned model before writing its folder."""
    from medadapt.recipes import registry, run_recipe
    from medadapt.training import TrainingError

    kind = registry.get_kind("moe")
    train = kind.train

    def poisoned(recipe, ctx):
        model = train(recipe, ctx)
        with torch.no_grad():
            next(p for p in model.parameters() if p.is_floating_point()).view(-1)[0] = float("inf")
        return model

    import dataclasses

    get_kind = registry.get_kind
    monkeypatch.setattr(registry, "get_kind",
                        lambda name, *a, **k: dataclasses.replace(kind, train=poisoned) if name == "moe" else get_kind(name, *a, **k))
    out = tmp_path / "run"
    with pytest.raises(TrainingError, match="not finite .*the model folder .* was not written"):
        run_recipe(RECIPE, out, _overrides(tiny_bert_dir, tiny_beir_dir, "training.epochs=1"), **QUIET)
    assert not out.exists()
