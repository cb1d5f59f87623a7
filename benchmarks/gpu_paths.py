"""The four systems' tiny CPU-twin recipes through the GPU paths of the one core (fp32, bf16, fp16), and the
one loop's GradCache accumulation on CUDA.

    python benchmarks/gpu_paths.py --output benchmarks/results/gpu_paths.json

Builds the tests' tiny random models (BERT, Qwen2) and tiny BEIR folder, trains each ``*-tiny.yaml`` recipe
with ``training.mixed_precision`` no / bf16 / fp16 on the first CUDA device, evaluates it, and reports the
first and last loss, nDCG@10, seconds and peak GPU memory per run; then trains a linear map with InfoNCE
at batch 16 and at batch 4 x 4 accumulation steps on CUDA and reports the largest parameter difference.
Tiny models: this checks that the paths run and learn, it measures no throughput.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))

from _common import base_parser, finish  # noqa: E402


def _systems(tmp: Path) -> dict[str, tuple[Path, list[str]]]:
    from conftest import build_tiny_beir, build_tiny_bert, build_tiny_qwen2

    bert = build_tiny_bert(tmp / "bert")
    qwen = build_tiny_qwen2(tmp / "qwen")
    beir = build_tiny_beir(tmp / "beir")
    recipes = ROOT / "recipes"
    return {
        "moe": (recipes / "med-moe-embed-tiny.yaml",
                [f"model.backbone={bert}", f"data.path={beir}", "data.hard_negatives.window=[2, 6]",
                 "training.batch_size=4", "training.lr=1e-2", "eval.split=test"]),
        "hyrec": (recipes / "hyrec-tiny.yaml", [f"model.backbone={bert}", f"data.path={beir}"]),
        "care": (recipes / "care-tiny.yaml", [f"document.model={qwen}", f"query.model={bert}", f"data.path={beir}"]),
        "bmretriever": (recipes / "bmretriever-tiny.yaml",
                        [f"model.name={qwen}", f"data.path={beir}", f"stage2.base_retriever={bert}"]),
    }


def _accumulation_check(device: str) -> float:
    import torch
    from torch import nn

    from medadapt.losses import InfoNCELoss
    from medadapt.training.config import OptimSection
    from medadapt.training.loop import Stage, train

    g = torch.Generator().manual_seed(0)
    q = torch.randn(32, 8, generator=g).to(device)
    d = (q.cpu() + 0.3 * torch.randn(32, 8, generator=g)).to(device)
    loss_fn = InfoNCELoss(0.1)

    class PairStep:
        def forward(self, model, batch):
            return {"q": model(q[batch.indices]), "d": model(d[batch.indices])}

        def loss(self, out, batch):
            return loss_fn(out["q"], out["d"])

    models = []
    for b, k in ((16, 1), (4, 4)):
        torch.manual_seed(1)
        model = nn.Linear(8, 8).to(device)
        train(model, [Stage("main", 32, PairStep(), list(model.parameters()),
                            OptimSection(batch_size=b, gradient_accumulation_steps=k, lr=1e-2, epochs=2))])
        models.append(model)
    return max(float((a - b).abs().max()) for a, b in zip(models[0].parameters(), models[1].parameters()))


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--systems", nargs="*", default=["moe", "hyrec", "care", "bmretriever"])
    p.add_argument("--precisions", nargs="*", default=["no", "bf16", "fp16"])
    args = p.parse_args()
    import torch

    from medadapt.cache import EmbeddingCache
    from medadapt.recipes import run_recipe

    if not torch.cuda.is_available():
        sys.exit("no CUDA device: this benchmark checks the GPU paths")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        systems = _systems(tmp)
        for name in args.systems:
            recipe, overrides = systems[name]
            for precision in args.precisions:
                torch.cuda.reset_peak_memory_stats()
                t0 = time.perf_counter()
                res = run_recipe(recipe, tmp / f"{name}-{precision}", [*overrides, f"training.mixed_precision={precision}"],
                                 cache=EmbeddingCache(tmp / "cache"), show_progress=False, log=lambda _m: None)
                hist = res.loss_history
                rows.append({"system": name, "precision": precision, "steps": len(hist),
                             "first loss": hist[0]["loss"], "last loss": hist[-1]["loss"],
                             "ndcg@10": res.metrics.get("ndcg@10", res.metrics.get("hybrid/ndcg@10", float("nan"))),
                             "seconds": round(time.perf_counter() - t0, 1),
                             "peak MiB": round(torch.cuda.max_memory_allocated() / 2**20, 1)})
                print(rows[-1], flush=True)
    diff = _accumulation_check("cuda")
    finish(args, rows, ["system", "precision", "steps", "first loss", "last loss", "ndcg@10", "seconds", "peak MiB"],
           {"device": torch.cuda.get_device_name(0), "accumulation_max_param_diff_cuda": diff})
    print(f"GradCache accumulation 4 x 4 vs batch 16 on CUDA: largest parameter difference {diff:.2e}")


if __name__ == "__main__":
    main()
