"""Why Med-MoE-Embed's literal paper setting (``--paper``) collapses: MedQuAD dev nDCG@10 of the paper head with one
factor changed at a time, each a real ``medadapt train recipes/med-moe-embed.yaml --paper`` run (frozen MiniLM, the
recipe's data, negatives and schedule).

    python benchmarks/moe_paper_collapse.py [VARIANT ...] --workdir runs/paper-collapse \
        --output benchmarks/results/moe_paper_collapse.json

Variants (default: all): ``paper-mlp`` (the paper head with MLP-SwiGLU / MLP-GELU experts in place of the two KAN
kinds, to isolate the KAN experts' cost), ``paper-mlp-tau0.05`` (InfoNCE at tau = 0.05 instead of eq. 3's plain
cosine), ``paper-mlp-residual`` (h added to v, zero-initialised, instead of replacing it), ``paper-kan-tau0.05`` and
``paper`` (the four paper experts, full KAN at 4h). Prints one line per run and writes the metrics JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "med-moe-embed.yaml"
MLP = ["head.routed_experts=[mlp_swiglu, mlp_gelu, mlp_swiglu, mlp_gelu]", "head.expert_options={}"]
RESIDUAL = ["head.residual=true", "head.zero_init_output=true"]
VARIANTS = {
    "paper-mlp": MLP,
    "paper-mlp-tau0.05": [*MLP, "loss.temperature=0.05"],
    "paper-mlp-residual": [*MLP, *RESIDUAL],
    "paper-kan-tau0.05": ["loss.temperature=0.05"],
    "paper": [],
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--workdir", default="runs/paper-collapse")
    p.add_argument("--output", default=None)
    a = p.parse_args()
    rows = []
    for name in a.variants:
        out = Path(a.workdir) / name
        cmd = [sys.executable, "-m", "medadapt", "train", str(RECIPE), "--paper", "--output", str(out), "--overwrite",
               "-q"]
        for setting in VARIANTS[name]:
            cmd += ["--set", setting]
        t = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode:
            print(f"{name}: failed\n{res.stderr[-2000:]}", flush=True)
            continue
        metrics = json.loads((out / "metrics.json").read_text())
        rows.append({"variant": name, "settings": VARIANTS[name], **metrics, "seconds": round(time.perf_counter() - t)})
        print(f"{name} | dev nDCG@10 {metrics['ndcg@10']:.4f} | Recall@100 {metrics['recall@100']:.4f} "
              f"| {rows[-1]['seconds']} s", flush=True)
    if a.output:
        Path(a.output).write_text(json.dumps({"rows": rows, "machine": platform.platform()}, indent=2) + "\n")


if __name__ == "__main__":
    main()
