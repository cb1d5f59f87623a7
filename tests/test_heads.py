"""Heads: one shared matrix over every expert (as a single-expert head) and MoE variants, plus KAN,
routing, config and attach specifics."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from sentence_transformers import SentenceTransformer

from medadapt.adapters import attach, find_head
from medadapt.adapters.linear import LinearHead, SearchAdaptorHead
from medadapt.errors import ConfigError
from medadapt.moe import MoEConfig, MoEHead, available_experts, build_expert
from medadapt.moe.kan import KANLayer, KANOptions, bspline_basis, uniform_bspline_basis, uniform_knots
from medadapt.moe.routing import TopKRouter


pytestmark = pytest.mark.usefixtures("_single_thread")

DIM = 32  # hidden size of the tiny_bert fixture
EXPERTS = ["mlp_gelu", "mlp_swiglu", "kan", "mlp_kan"]
PAPER_ROUTED = ["mlp_swiglu", "mlp_gelu", "kan", "mlp_kan"]

HEAD_CASES = {
    **{f"single_{name}": dict(shared_experts=[name], routed_experts=[], top_k=0) for name in EXPERTS},
    "single_kan_pykan_backend": dict(
        shared_experts=["kan"], routed_experts=[], top_k=0, expert_options={"kan": {"backend": "pykan"}}
    ),
    "moe_paper": {},
    "moe_routed_only_top1": dict(shared_experts=[], routed_experts=["mlp_gelu", "kan"], top_k=1),
    "moe_raw_gate_top3": dict(
        routed_experts=["mlp_gelu", "mlp_swiglu", "mlp_kan"], top_k=3, renormalize_top_k=False
    ),
}


def make_head(case: str, **overrides) -> MoEHead:
    torch.manual_seed(0)
    return MoEHead(MoEConfig(dim=DIM, **{**HEAD_CASES[case], **overrides}))


@torch.no_grad()
def perturb_(module: torch.nn.Module, scale: float = 0.1) -> torch.nn.Module:
    """Give every parameter a random offset so the head computes a non-trivial function."""
    generator = torch.Generator().manual_seed(1)
    for p in module.parameters():
        p.add_(scale * torch.randn(p.shape, generator=generator))
    return module


def freeze_backbone(model: SentenceTransformer, head: torch.nn.Module) -> None:
    head_ids = {id(p) for p in head.parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) in head_ids)


TEXTS = ["symptoms of diabetes", "asthma inhaler", "gout toe pain", "migraine aura"]


# ---------------------------------------------------------------------------------------- shared matrix
HAS_PYKAN = importlib.util.find_spec("kan") is not None
MATRIX = [
    pytest.param(case, marks=pytest.mark.skipif(not HAS_PYKAN, reason="pykan (extra [kan]) not installed"))
    if "pykan" in case
    else case
    for case in HEAD_CASES
]


@pytest.mark.parametrize("case", MATRIX)
class TestHeadMatrix:
    def test_shapes_and_finite(self, case):
        head = perturb_(make_head(case))
        for shape in [(7, DIM), (2, 3, DIM)]:
            out = head({"sentence_embedding": torch.randn(shape)})["sentence_embedding"]
            assert out.shape == shape
            assert torch.isfinite(out).all()

    def test_identity_at_init(self, case):
        head = make_head(case)
        v = torch.randn(9, DIM) * 3
        assert torch.equal(head({"sentence_embedding": v.clone()})["sentence_embedding"], v)

    def test_gradients_reach_only_head(self, case, tiny_bert):
        head = make_head(case)
        model = attach(tiny_bert, head)
        freeze_backbone(model, head)
        model.train()
        features = model.preprocess(TEXTS)
        out = model(features)["sentence_embedding"]
        (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(0))).sum().backward()
        head_ids = {id(p) for p in head.parameters()}
        backbone = [p for p in model.parameters() if id(p) not in head_ids]
        assert backbone and all(p.grad is None for p in backbone)
        grads = [p.grad for p in head.parameters() if p.grad is not None]
        assert grads and any(g.abs().sum() > 0 for g in grads)
        assert all(torch.isfinite(g).all() for g in grads)

    def test_save_load_roundtrip(self, case, tiny_bert, tmp_path):
        head = perturb_(make_head(case))
        model = attach(tiny_bert, head).eval()
        model.save(str(tmp_path / "m"))
        reloaded = SentenceTransformer(str(tmp_path / "m"), trust_remote_code=True, device="cpu")
        loaded_head = find_head(reloaded, MoEHead)
        assert loaded_head is not None and loaded_head.config == head.config
        for method in ("encode", "encode_query", "encode_document"):
            expected = getattr(model, method)(TEXTS, convert_to_tensor=True)
            actual = getattr(reloaded, method)(TEXTS, convert_to_tensor=True)
            torch.testing.assert_close(actual, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("case, old", [
    ("moe_paper", "medadapt.heads.moe.MoEHead"),
    ("linear", "medadapt.heads.linear.LinearHead"),
    ("search_adaptor", "medadapt.heads.linear.SearchAdaptorHead"),
])
def test_model_folders_naming_the_old_head_paths_still_load(case, old, tiny_bert, tmp_path):
    """New folders name the heads' homes (``medadapt.moe.head``, ``medadapt.adapters.linear``); folders saved
    when they lived in ``medadapt.heads`` name the alias modules, which load to identical embeddings."""
    import medadapt

    torch.manual_seed(0)
    head = {"moe_paper": lambda: make_head("moe_paper"), "linear": lambda: LinearHead(DIM, bias=True),
            "search_adaptor": lambda: SearchAdaptorHead(DIM, bias=True, scale=0.5)}[case]()
    cls = type(head)
    frozen = tiny_bert.encode(TEXTS, convert_to_tensor=True)
    model = attach(tiny_bert, perturb_(head)).eval()
    model.save(str(tmp_path / "m"))
    modules = json.loads((tmp_path / "m" / "modules.json").read_text())
    saved = [m for m in modules if m["type"].endswith(cls.__name__)]
    assert [m["type"] for m in saved] == [f"{cls.__module__}.{cls.__name__}"]
    assert not cls.__module__.startswith("medadapt.heads")
    saved[0]["type"] = old
    (tmp_path / "m" / "modules.json").write_text(json.dumps(modules))
    reloaded = medadapt.load(str(tmp_path / "m"), device="cpu")
    assert find_head(reloaded, cls) is not None
    expected = model.encode(TEXTS, convert_to_tensor=True)
    assert not torch.allclose(expected, frozen, atol=1e-3)  # the head changes the embeddings
    torch.testing.assert_close(reloaded.encode(TEXTS, convert_to_tensor=True), expected, atol=1e-6, rtol=0)


def test_alpha_is_a_one_element_vector_and_folders_with_a_scalar_alpha_still_load(tiny_bert, tmp_path):
    """FSDP and DeepSpeed ZeRO refuse 0-dim parameters (seen on an H100: "FSDP doesn't support scalar
    parameters"), so alpha has shape (1,); folders saved with the scalar alpha load to the same encodings."""
    from safetensors.torch import load_file, save_file

    head = perturb_(make_head("moe_paper"))
    assert head.alpha.shape == (1,) and all(p.dim() > 0 for p in head.parameters())
    model = attach(tiny_bert, head).eval()
    model.save(str(tmp_path / "m"))
    files = [f for f in (tmp_path / "m").rglob("*.safetensors") if "alpha" in load_file(str(f))]
    assert len(files) == 1
    state = load_file(str(files[0]))
    assert state["alpha"].shape == (1,)
    state["alpha"] = state["alpha"].reshape(())  # what folders saved before this change hold
    save_file(state, str(files[0]))
    old = SentenceTransformer(str(tmp_path / "m"), trust_remote_code=True, device="cpu")
    assert find_head(old, MoEHead).alpha.shape == (1,)
    expected = model.encode(TEXTS, convert_to_tensor=True)
    torch.testing.assert_close(old.encode(TEXTS, convert_to_tensor=True), expected, atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------ experts
def test_registry_lists_builtin_experts_and_rejects_unknown():
    assert set(EXPERTS) <= set(available_experts())
    with pytest.raises(ConfigError, match="valid names"):
        build_expert("nope", DIM)
    with pytest.raises(ConfigError, match="accepted"):
        build_expert("mlp_gelu", DIM, grid_size=3)
    assert build_expert("mlp_kan", DIM, groups=4, expansion=2)(torch.randn(3, DIM)).shape == (3, DIM)


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_uniform_basis_matches_cox_de_boor(order):
    knots = uniform_knots(5, order, (-1.0, 1.0))
    x = (torch.rand(500, generator=torch.Generator().manual_seed(0)) * 5 - 2.5).requires_grad_()
    fast = uniform_bspline_basis(x, float(knots[0]), 0.4, knots.numel(), order)
    reference = bspline_basis(x, knots, order)
    torch.testing.assert_close(fast, reference, atol=1e-6, rtol=0)
    weights = torch.randn(fast.shape[-1])
    (grad_fast,) = torch.autograd.grad((fast * weights).sum(), x)
    (grad_reference,) = torch.autograd.grad((reference * weights).sum(), x)
    torch.testing.assert_close(grad_fast, grad_reference, atol=1e-4, rtol=1e-4)


def test_kan_backends_compute_the_same_function():
    pytest.importorskip("kan")
    torch.manual_seed(0)
    options = dict(grid_size=5, spline_order=3, squash="layernorm_tanh")
    reference = KANLayer(6, 5, KANOptions(backend="pykan", **options))
    fast = KANLayer(6, 5, KANOptions(backend="fast", **options))
    fast.edges.copy_from_pykan(reference.edges.layer)
    x = torch.randn(40, 6) * 2
    torch.testing.assert_close(fast(x), reference(x), atol=1e-5, rtol=1e-5)

    reference_expert = build_expert("kan", 8, expansion=2, zero_init_output=False, backend="pykan")
    fast_expert = build_expert("kan", 8, expansion=2, zero_init_output=False)
    fast_expert.up.edges.copy_from_pykan(reference_expert.up.edges.layer)
    fast_expert.down.edges.copy_from_pykan(reference_expert.down.edges.layer)
    v = torch.randn(20, 8)
    torch.testing.assert_close(fast_expert(v), reference_expert(v), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------ routing
@pytest.mark.parametrize("top_k", [1, 2, 3, 4])
@pytest.mark.parametrize("mode", ["learned", "random"])
def test_top_k_gate_selects_exactly_k(top_k, mode):
    torch.manual_seed(0)
    router = TopKRouter(DIM, num_experts=4, top_k=top_k, renormalize=True, init_std=1.0)
    decision = router(torch.randn(50, DIM), mode)
    assert (decision.selected.sum(-1) == top_k).all()
    assert ((decision.weights > 0) == decision.selected).all()
    torch.testing.assert_close(decision.weights.sum(-1), torch.ones(50))
    if mode == "learned":  # the kept experts are the k most affine ones
        kth = decision.probs.topk(top_k, dim=-1).values[:, -1:]
        assert (decision.probs[decision.selected].reshape(50, top_k) >= kth).all()


def test_raw_gate_keeps_affinity_scores():
    router = TopKRouter(DIM, num_experts=4, top_k=2, renormalize=False, init_std=1.0)
    decision = router(torch.randn(10, DIM))
    torch.testing.assert_close(decision.weights[decision.selected], decision.probs[decision.selected])


def test_routing_modes_stats_and_aux_loss():
    head = perturb_(make_head("moe_paper"))
    v = torch.randn(64, DIM)
    head.train()
    features = head({"sentence_embedding": v.clone()})
    assert features["moe_aux_loss"] is head.last_aux_loss and head.last_aux_loss.requires_grad
    stats = head.routing_stats()
    assert stats["names"] == PAPER_ROUTED
    assert sum(stats["running_counts"]) == 64 * 2 and stats["inputs_seen"] == 64
    assert sum(stats["last_load"]) == pytest.approx(1.0)
    head.eval()
    assert "moe_aux_loss" not in head({"sentence_embedding": v.clone()})
    head.set_routing("off")
    shared_only = v + head.shared_experts[0](v)
    torch.testing.assert_close(head.transform(v), shared_only)
    assert float(head.last_aux_loss) == 0.0
    head.reset_routing_stats()
    assert head.routing_stats()["inputs_seen"] == 0
    with pytest.raises(ConfigError):
        head.set_routing("sometimes")


# ------------------------------------------------------------------------------------------------- config
def test_config_validation_and_round_trip():
    config = MoEConfig(dim=DIM, expert_options={"kan": {"grid_size": 4, "grid_range": (-2.0, 2.0)}})
    assert MoEConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert MoEHead(config).routed_experts[2].up.edges.n_basis == 4 + 3
    with pytest.raises(ConfigError, match="accepted"):
        MoEConfig(dim=DIM, expert_options={"kan": {"grid": 4}})
    assert MoEConfig.single_expert(DIM).top_k == 0
    with pytest.raises(ConfigError, match="valid keys"):
        MoEConfig.from_dict({"dim": DIM, "topk": 2})
    with pytest.raises(ConfigError, match="top_k"):
        MoEConfig(dim=DIM, top_k=5)
    with pytest.raises(ConfigError, match="top_k must be 0"):
        MoEConfig(dim=DIM, routed_experts=[], top_k=2)
    with pytest.raises(ConfigError, match="untrainable"):
        MoEConfig(dim=DIM, alpha_init=0.0)
    with pytest.raises(ConfigError, match="valid names"):
        MoEConfig(dim=DIM, shared_experts=["mlp_relu"])
    with pytest.raises(ConfigError, match="not in this head"):
        MoEConfig.single_expert(DIM, expert_options={"kan": {}})


# ------------------------------------------------------------------------------------------------- attach
def test_attach_inserts_before_normalize_and_find_head(tiny_bert):
    assert find_head(tiny_bert, MoEHead) is None
    head = make_head("single_mlp_gelu")
    model = attach(tiny_bert, head)
    kinds = [type(m).__name__ for m in model]
    assert kinds[-2:] == ["MoEHead", "Normalize"]
    assert find_head(model, MoEHead) is head
    raw = SentenceTransformer(modules=[model[0], model[1]], device="cpu")
    attach(raw, make_head("single_kan"))
    assert type(raw[-1]).__name__ == "MoEHead"
    with pytest.raises(ValueError, match="dimension"):
        attach(tiny_bert, MoEHead(MoEConfig.single_expert(DIM + 1)))


def test_residual_scale_interpolates_and_training_ignores_it():
    import torch

    from medadapt.errors import ConfigError
    from medadapt.moe import MoEConfig, MoEHead

    torch.manual_seed(0)
    head = MoEHead(MoEConfig.single_expert(16, "mlp_gelu", zero_init_output=False))
    v = torch.randn(5, 16)
    full = head({"sentence_embedding": v.clone()})["sentence_embedding"]
    head.residual_scale = 0.5
    half = head({"sentence_embedding": v.clone()})["sentence_embedding"]
    torch.testing.assert_close(half, v + 0.5 * (full - v))
    head.residual_scale = 0.0
    torch.testing.assert_close(head({"sentence_embedding": v.clone()})["sentence_embedding"], v)
    assert head.get_config_dict()["residual_scale"] == 0.0
    with pytest.raises(ConfigError, match="residual_scale"):
        MoEConfig.single_expert(16, residual_scale=1.5)


def test_train_head_learns_at_full_scale_and_restores_scale():
    import torch

    from medadapt.moe import MoEConfig, MoEHead, MoETrainingSection, train_head

    q, d = torch.randn(32, 16), torch.randn(32, 16)
    torch.manual_seed(0)
    a = MoEHead(MoEConfig.single_expert(16, "mlp_gelu"))
    torch.manual_seed(0)
    b = MoEHead(MoEConfig.single_expert(16, "mlp_gelu", residual_scale=0.3))
    cfg = MoETrainingSection(epochs=1, shared_epochs=1, batch_size=16, lr=1e-3)
    ra, rb = train_head(a, q, d, None, cfg), train_head(b, q, d, None, cfg)
    assert [r["loss"] for r in ra.loss_history] == [r["loss"] for r in rb.loss_history]
    assert b.residual_scale == 0.3


def test_random_routing_follows_given_noise():
    """Random routing picks the top-k of the given uniform scores (how the trainer makes N processes route
    like one); a wrongly shaped noise is refused; learned routing ignores noise."""
    from medadapt.moe.routing import TopKRouter

    torch.manual_seed(0)
    router = TopKRouter(dim=8, num_experts=4, top_k=2, renormalize=True, init_std=0.1)
    v = torch.randn(3, 8)
    noise = torch.tensor([[0.9, 0.1, 0.8, 0.0], [0.0, 0.7, 0.2, 0.6], [0.3, 0.4, 0.5, 0.95]])
    decision = router(v, "random", noise=noise)
    assert decision.selected.tolist() == [[True, False, True, False], [False, True, False, True],
                                          [False, False, True, True]]
    assert torch.allclose(decision.weights.sum(-1), torch.ones(3))
    with pytest.raises(ValueError, match="shape"):
        router(v, "random", noise=noise[:2])
    learned = router(v, "learned")
    assert torch.equal(router(v, "learned").selected, learned.selected)
