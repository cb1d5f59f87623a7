"""FSDP1 wrap policy (medadapt.training.distributed.fsdp_wrap_policy), run with torch's real FSDP on CPU
(gloo, one process: FSDP switches to NO_SHARD but flattens and hooks exactly as on a GPU). Accelerate's
FSDP path itself needs CUDA, so its plugin is exercised directly."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from _helpers import PairStep, StopRun, pair_data
from conftest import CpuAccelerator


@pytest.fixture()
def process_group():
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already running")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _fsdp(model: nn.Module, policy):
    import warnings

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "switching to NO_SHARD since the world size is 1"
        return FSDP(model, auto_wrap_policy=policy, use_orig_params=True, device_id=torch.device("cpu"))


def _units(wrapped: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return [m for m in wrapped.modules() if isinstance(m, FSDP)]


def _gradient_elements(wrapped: nn.Module) -> int:
    """Elements of the gradients FSDP holds: one per flat parameter, whatever the original flags."""
    total = 0
    for unit in _units(wrapped):
        handle = unit._handle
        if handle is not None and handle.flat_param.grad is not None:
            total += handle.flat_param.grad.numel()
    return total


def _grads(wrapped: nn.Module) -> dict[str, torch.Tensor]:
    return {n.replace("_fsdp_wrapped_module.", ""): p.grad.clone()
            for n, p in wrapped.named_parameters() if p.grad is not None}


def _lora_decoder(folder: Path):
    from medadapt.bmretriever import build_retriever
    from medadapt.recipes.base import LoraSection
    from medadapt.training.lora import attach_lora

    torch.manual_seed(0)
    model = build_retriever(str(folder), "decoder", device="cpu")
    attach_lora(model, LoraSection(r=2, alpha=4, dropout=0.0))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # PEFT starts B at zero: give A a gradient too
            nn.init.normal_(p, std=0.1)
    return model


def test_lora_matrices_are_units_of_their_own_so_frozen_weights_get_no_gradient(tiny_qwen2_right_dir, process_group):
    """Accelerate's TRANSFORMER_BASED_WRAP reads the root's _no_split_modules, which a SentenceTransformer has
    not: the whole model was one flat parameter, and FSDP gave every frozen weight a gradient (the H100's
    4.13 vs 2.66 GiB). With the policy only the LoRA matrices get gradients, each decoder layer is a unit,
    and the LoRA gradients are the same."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    from medadapt.training.distributed import fsdp_wrap_policy

    out = {}
    for mode in ("root", "policy"):
        model = _lora_decoder(tiny_qwen2_right_dir)
        n_all = sum(p.numel() for p in model.parameters())
        n_lora = sum(p.numel() for p in model.parameters() if p.requires_grad)
        layers = sum(isinstance(m, Qwen2DecoderLayer) for m in model.modules())
        wrapped = _fsdp(model, fsdp_wrap_policy(model) if mode == "policy" else None)
        # a plain dict: FSDP hooks the tensors of dicts, not of tokenize()'s BatchEncoding (a UserDict)
        features = dict(model.tokenize(["fever and cough", "a rash on both arms after a new drug"]))
        emb = wrapped(features)["sentence_embedding"]
        (emb @ emb.T).sum().backward()
        out[mode] = (_gradient_elements(wrapped), _grads(wrapped), len(_units(wrapped)))
    assert out["root"][0] == n_all and out["root"][2] == 1
    assert out["policy"][0] == n_lora < n_all / 10
    assert out["policy"][2] == 1 + layers + len(out["policy"][1])  # root, layers, one unit per LoRA matrix
    assert out["root"][1].keys() == out["policy"][1].keys() and all("lora_" in k for k in out["root"][1])
    for k, g in out["root"][1].items():
        torch.testing.assert_close(out["policy"][1][k], g, rtol=0, atol=0)


class _Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.alpha = nn.Parameter(torch.ones(1))  # held by a module with children, as Med-MoE-Embed's is

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.alpha * self.proj(h)


class _HeadOnFrozenBody(nn.Module):
    """A frozen body with tied, trainable input / output weights and a trainable head, declaring
    ``_no_split_modules`` as a Hugging Face model does (no layer class: the leaf rule alone)."""

    _no_split_modules: list[str] = []

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.body = nn.Linear(8, 8)
        self.out = nn.Linear(8, 50, bias=False)
        self.out.weight = self.embed.weight
        self.head = _Head()
        self.body.requires_grad_(False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.head(self.body(self.embed(ids))))


def test_policy_splits_off_trainable_leaves_but_never_tied_weights(process_group):
    from medadapt.training.distributed import fsdp_wrap_policy

    torch.manual_seed(0)
    model = _HeadOnFrozenBody()
    policy = fsdp_wrap_policy(model)
    wrap = policy._lambda_fn
    assert wrap(model.head.proj)
    assert not wrap(model.head)  # alpha stays in the enclosing unit: only leaves are split off
    assert not wrap(model.body)  # frozen
    assert not wrap(model.embed) and not wrap(model.out)  # one parameter in two modules
    assert not wrap(model)
    reference = _HeadOnFrozenBody()
    reference.load_state_dict(model.state_dict())
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    reference(ids).square().mean().backward()
    wrapped = _fsdp(model, policy)
    assert len(_units(wrapped)) == 2
    wrapped(ids).square().mean().backward()
    got = _grads(wrapped)
    for name, p in reference.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(got[name], p.grad)
    trainable = sum(p.numel() for p in reference.parameters() if p.requires_grad)
    # the root unit mixes the frozen body with the tied embedding and alpha: only the body's gradient is extra
    assert _gradient_elements(wrapped) == trainable + sum(p.numel() for p in reference.body.parameters())


def test_a_fully_trainable_model_is_wrapped_by_layers_only(tiny_bert):
    from transformers.models.bert.modeling_bert import BertLayer

    from medadapt.training.distributed import fsdp_wrap_policy

    wrap = fsdp_wrap_policy(tiny_bert)._lambda_fn
    units = [m for m in tiny_bert.modules() if wrap(m)]
    declared = set(tiny_bert[0].model._no_split_modules)  # BertEmbeddings, BertLayer
    assert {type(m).__name__ for m in units} == declared
    assert sum(isinstance(m, BertLayer) for m in units) == tiny_bert[0].model.config.num_hidden_layers
    assert fsdp_wrap_policy(nn.Linear(2, 2)) is None  # nothing to split off the root


def test_use_fsdp_wrap_policy_replaces_accelerates_default_and_keeps_a_chosen_policy(tiny_qwen2_right_dir):
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    from medadapt.training.distributed import use_fsdp_wrap_policy

    def accelerator(**kwargs):
        return SimpleNamespace(state=SimpleNamespace(fsdp_plugin=FullyShardedDataParallelPlugin(**kwargs)))

    model = _lora_decoder(tiny_qwen2_right_dir)
    acc = accelerator(fsdp_version=1, auto_wrap_policy="transformer_based_wrap", use_orig_params=True)
    assert use_fsdp_wrap_policy(acc, model)
    ours = acc.state.fsdp_plugin.auto_wrap_policy
    acc.state.fsdp_plugin.set_auto_wrap_policy(model)  # what Accelerator.prepare_model does next
    assert acc.state.fsdp_plugin.auto_wrap_policy is ours
    # a later wrap (the next phase) gets a policy for the flags of that moment
    for p in model.parameters():
        p.requires_grad_(True)
    assert use_fsdp_wrap_policy(acc, model) and acc.state.fsdp_plugin.auto_wrap_policy is not ours

    kept = accelerator(fsdp_version=1, auto_wrap_policy="size_based_wrap")
    assert not use_fsdp_wrap_policy(kept, model)
    assert kept.state.fsdp_plugin.auto_wrap_policy is size_based_auto_wrap_policy
    named = accelerator(fsdp_version=1, auto_wrap_policy="transformer_based_wrap",
                        transformer_cls_names_to_wrap=["Qwen2DecoderLayer"])
    assert not use_fsdp_wrap_policy(named, model)
    assert not use_fsdp_wrap_policy(accelerator(fsdp_version=2, auto_wrap_policy="transformer_based_wrap"), model)
    # a model with nothing to split off gets the root unit alone, and the next model its own policy again
    assert not use_fsdp_wrap_policy(acc, nn.Linear(2, 2))
    acc.state.fsdp_plugin.set_auto_wrap_policy(nn.Linear(2, 2))
    assert use_fsdp_wrap_policy(acc, model)
    assert not use_fsdp_wrap_policy(SimpleNamespace(state=SimpleNamespace()), model)  # no FSDP


class _CpuFsdpAccelerator(CpuAccelerator):
    """What the one loop uses of an ``Accelerator`` launched with ``recipes/accelerate/fsdp.yaml``, with
    ``prepare_model`` doing what Accelerate's FSDP1 branch does (``set_auto_wrap_policy``, then torch's FSDP
    with the plugin's policy); Accelerate itself runs FSDP on GPUs only."""

    distributed_type = "DistributedType.FSDP"

    def __init__(self, rank: int = 0, world: int = 1) -> None:
        from accelerate.utils import FullyShardedDataParallelPlugin

        super().__init__(rank, world)
        plugin = FullyShardedDataParallelPlugin(fsdp_version=1, auto_wrap_policy="transformer_based_wrap",
                                                use_orig_params=True)
        self.state = SimpleNamespace(fsdp_plugin=plugin)
        self.wrapped: list[nn.Module] = []
        self.units: list[int] = []

    def prepare_model(self, model):
        plugin = self.state.fsdp_plugin
        plugin.set_auto_wrap_policy(model)
        self.wrapped.append(_fsdp(model, plugin.auto_wrap_policy))
        self.units.append(len(_units(self.wrapped[-1])))
        return self.wrapped[-1]


class _Stack(nn.Sequential):
    _no_split_modules: list[str] = []  # as a Hugging Face model declares it: its leaves may be split off


def test_the_loop_under_fsdp_wraps_once_with_the_policy_and_trains_as_without_it(process_group):
    """Two stages with separate optimisers on a frozen body: the loop hands Accelerate the wrap policy, wraps
    once, clips with FSDP's norm, and ends with the parameters of the plain loop. (FSDP's norm had included
    the other stage's gradients: losses 2e-3 apart within two epochs.)"""
    plain, res_plain = _two_phase_run(None, None)
    acc = _CpuFsdpAccelerator()
    sharded, res_sharded = _two_phase_run(acc, None)
    assert len(acc.wrapped) == 1  # once for both optimisers
    assert acc.units == [3]  # the root (frozen body) and each trainable linear layer
    assert [r["loss"] for r in res_sharded.loss_history] == pytest.approx(
        [r["loss"] for r in res_plain.loss_history], abs=1e-6)
    # the model comes back unwrapped and whole, with the parameter objects it went in with
    assert not _units(sharded)
    for (name, a), (_, b) in zip(plain.named_parameters(), sharded.named_parameters()):
        torch.testing.assert_close(b, a, msg=name)


def test_gradcache_accumulation_under_fsdp_trains_as_without_it(process_group):
    """GradCache under FSDP: chunks run without gradients, the loss on all of them, then each chunk again
    through the wrapped model with its cached output gradients (dropout replayed) and FSDP's reduction at
    every chunk backward. Refused before (CARE's accumulated paper phases had to run under DDP)."""
    plain, res_plain = _two_phase_run(None, None, accumulation=2, dropout=0.1)
    sharded, res_sharded = _two_phase_run(_CpuFsdpAccelerator(), None, accumulation=2, dropout=0.1)
    assert len(res_sharded.loss_history) == len(res_plain.loss_history) == 16  # 2 stages x 2 epochs x 4 steps
    assert [r["loss"] for r in res_sharded.loss_history] == pytest.approx(
        [r["loss"] for r in res_plain.loss_history], abs=1e-6)
    for (name, a), (_, b) in zip(plain.named_parameters(), sharded.named_parameters()):
        torch.testing.assert_close(b, a, msg=name)


# ------------------------------------------------------------------------- two processes, sharded for real
class _StopAfter:
    """A PairStep that raises on every process at its ``after``-th forward (the same step everywhere)."""

    def __init__(self, step, after: int | None) -> None:
        self.step, self.after, self.calls = step, after, 0

    def forward(self, model, batch):
        self.calls += 1
        if self.after is not None and self.calls > self.after:
            raise StopRun
        return self.step.forward(model, batch)

    def loss(self, out, batch):
        return self.step.loss(out, batch)


def _two_phase_run(accelerator, checkpoint_dir: Path | None, stop_after: int | None = None, accumulation: int = 1,
                   dropout: float = 0.0):
    """Two phases with separate optimisers (the first one finished and released when the second stops) on a
    frozen first layer; checkpoints every 2 steps. Global batch 8, in ``accumulation`` GradCache chunks."""
    from medadapt.training.checkpoint import CheckpointConfig
    from medadapt.training.config import OptimSection
    from medadapt.training.loop import Stage, train

    torch.manual_seed(1)
    model = _Stack(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8))
    model[0].requires_grad_(False)
    q, d = pair_data()
    optim = OptimSection(batch_size=8 // accumulation, gradient_accumulation_steps=accumulation, lr=1e-2, epochs=2,
                         warmup_ratio=0.0, max_grad_norm=0.5)
    step_a = _StopAfter(PairStep(q, d, dropout), None)
    step_b = _StopAfter(PairStep(q, d, dropout), stop_after)
    stages = [Stage("a", len(q), step_a, list(model[1].parameters()), optim),
              Stage("b", len(q), step_b, list(model[2].parameters()), optim)]
    ckpt = CheckpointConfig(checkpoint_dir, every_steps=2) if checkpoint_dir is not None else None
    res = train(model, stages, seed=3, accelerator=accelerator, checkpoint=ckpt, fingerprint="f")
    return model, res


def _second_call(model, accelerator):
    """A later phase on the same model (CARE and HyReC run one loop per phase): the model must come back
    from the first call ready to be wrapped and sharded again."""
    from medadapt.training.config import OptimSection
    from medadapt.training.loop import Stage, train

    q, d = pair_data(seed=5)
    optim = OptimSection(batch_size=8, lr=1e-2, epochs=2, warmup_ratio=0.0)
    params = [p for m in (model[1], model[2]) for p in m.parameters()]
    return train(model, [Stage("c", len(q), PairStep(q, d), params, optim)], seed=4, accelerator=accelerator)


def _two_process_worker(rank: int, root: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=rank, world_size=2)
    try:
        acc = _CpuFsdpAccelerator(rank, 2)
        model, res = _two_phase_run(acc, Path(root) / "whole")
        with pytest.raises(StopRun):  # killed in phase b, after its step-6 checkpoint, on both processes
            _two_phase_run(_CpuFsdpAccelerator(rank, 2), Path(root) / "resumed", stop_after=3)
        resumed, res_resumed = _two_phase_run(_CpuFsdpAccelerator(rank, 2), Path(root) / "resumed")
        accumulated, res_accumulated = _two_phase_run(_CpuFsdpAccelerator(rank, 2), None, accumulation=2)
        whole = {k: v.clone() for k, v in model.state_dict().items()}
        later = _second_call(model, acc)
        if rank == 0:
            torch.save({"whole": whole, "resumed": resumed.state_dict(), "later": model.state_dict(),
                        "accumulated": accumulated.state_dict(),
                        "losses_accumulated": [r["loss"] for r in res_accumulated.loss_history],
                        "losses": [r["loss"] for r in res.loss_history],
                        "losses_later": [r["loss"] for r in later.loss_history],
                        "losses_resumed": [r["loss"] for r in res_resumed.loss_history],
                        "shards": acc.units}, f"{root}/out.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_processes_under_fsdp_train_like_one_and_resume_like_an_uninterrupted_run(tmp_path):
    """FULL_SHARD over 2 gloo processes: each holds half of every flat parameter. The loop's checkpoints
    hold whole tensors and optimiser states, a run killed mid-phase resumes onto the uninterrupted one, and
    the model comes back whole, equal to the one-process run without FSDP."""
    import torch.multiprocessing as mp

    from medadapt.training.checkpoint import latest_checkpoint, load_checkpoint

    plain, res_plain = _two_phase_run(None, None)
    unfinished = {k: v.clone() for k, v in plain.state_dict().items()}
    later = _second_call(plain, None)
    mp.spawn(_two_process_worker, args=(str(tmp_path),), nprocs=2, join=True)
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert out["shards"] == [3, 3]  # wrapped again for the later call, sharded as the first time
    assert out["losses_later"] == pytest.approx([r["loss"] for r in later.loss_history], abs=1e-5)
    for name, value in plain.state_dict().items():
        torch.testing.assert_close(out["later"][name], value, atol=1e-6, rtol=1e-5, msg=f"later: {name}")
    expected = unfinished
    for run in ("whole", "resumed", "accumulated"):  # accumulated: 2 chunks of 4 (2 per process) = batch 8
        assert out[run].keys() == expected.keys()
        for name, value in expected.items():
            torch.testing.assert_close(out[run][name], value, atol=1e-6, rtol=1e-5, msg=f"{run}: {name}")
    assert out["losses"] == pytest.approx([r["loss"] for r in res_plain.loss_history], abs=1e-5)
    assert out["losses_resumed"] == pytest.approx(out["losses"], abs=1e-6)
    assert out["losses_accumulated"] == pytest.approx(out["losses"], abs=1e-5)
    tensors, opt, _ = load_checkpoint(latest_checkpoint(tmp_path / "whole"))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == {
        k: tuple(v.shape) for k, v in expected.items() if not k.startswith("0.")}
    assert len(opt["#1"]["optimizer"]["state"]) == 2  # both of phase b's parameters, whole


@pytest.mark.slow
def test_care_tiny_init_under_fsdp_on_two_processes_matches_the_run_without_it(tmp_path):
    """Every CARE phase through the loop's FSDP branch (benchmarks/fsdp_cpu.py: torch's FSDP over gloo, two
    processes, each holding half of every flat parameter): RetroMAE with its tied decoder, the unsupervised
    phase with its learnable temperature (both with the recipe's GradCache accumulation, 2 chunks of 4), the
    tower re-wrapped phase after phase. Before the fixes the second phase refused to wrap, and then trained on
    local gradients only."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "fsdp_cpu.py"), "all", "--dir", str(tmp_path),
                           "--recipes", "care-tiny-init", "--processes", "2"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["engine"]: r for r in map(json.loads, (tmp_path / "rows.jsonl").read_text().splitlines())}
    plain, fsdp = rows["plain"], rows["fsdp"]
    assert len(fsdp["wraps"]) == 6 and all(units > 1 for _, units in fsdp["wraps"])
    assert fsdp["losses"] == pytest.approx(plain["losses"], abs=1e-5)
    assert fsdp["metrics"] == pytest.approx(plain["metrics"], abs=1e-6)


class _EmbedSquare:
    """A step on a SentenceTransformer: mean squared embedding of the batch's texts."""

    def __init__(self, model, texts: list[str]) -> None:
        self.model, self.texts = model, texts

    def forward(self, run_model, batch):
        features = dict(self.model.tokenize([self.texts[i] for i in batch.indices]))
        return {"e": run_model(features)["sentence_embedding"]}

    def loss(self, out, batch):
        return {"loss": out["e"].square().mean()}


def test_lora_trained_under_fsdp_merges_like_without_it(tiny_qwen2_right_dir, process_group):
    """With one process FSDP left plain-tensor views of the frozen weights as module attributes, shadowing
    the parameters the loop handed back: PEFT's merge (CARE merges the document tower's LoRA after its
    phase) added the update to the stale views, and the model kept its unmerged weights (1.3e-3 apart in
    CARE's stage I, 0.09 here)."""
    from medadapt.training.config import OptimSection
    from medadapt.training.lora import merge_lora
    from medadapt.training.loop import Stage, train

    merged = {}
    for mode in ("plain", "fsdp"):
        model = _lora_decoder(tiny_qwen2_right_dir)
        step = _EmbedSquare(model, ["fever and cough", "a rash", "chest pain at night", "dry eyes"] * 2)
        params = [p for p in model.parameters() if p.requires_grad]
        train(model, [Stage("s", 8, step, params, OptimSection(batch_size=4, lr=1e-2, epochs=1, warmup_ratio=0.0))],
              seed=1, accelerator=_CpuFsdpAccelerator() if mode == "fsdp" else None)
        shadowed = [n for n, m in model.named_modules() for k in m._parameters if k in m.__dict__]
        assert not shadowed
        assert merge_lora(model)
        merged[mode] = model.state_dict()
    for name, value in merged["plain"].items():
        torch.testing.assert_close(merged["fsdp"][name], value, msg=name)
