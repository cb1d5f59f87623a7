"""The one training loop's FSDP branch on CPU processes (torch's FSDP1 over gloo), against the same run
without FSDP, for the systems that train through it (CARE, HyReC, the Med-MoE-Embed head).

    python benchmarks/fsdp_cpu.py all --dir /tmp/fc --processes 1 2 --output benchmarks/results/fsdp_cpu.json

Accelerate runs FSDP on GPUs only, so each worker takes the ``Accelerator`` that ``medadapt.recipes.run``
makes (CPU; gloo under ``torchrun``) and gives it a ``prepare_model`` that does what Accelerate's FSDP1
branch does with ``recipes/accelerate/fsdp.yaml``: ``set_auto_wrap_policy``, then torch's
``FullyShardedDataParallel`` with the plugin's wrap policy and ignored modules, ``use_orig_params``,
``FULL_SHARD``. Everything else (the loop, its checkpoints, unwrapping between phases, evaluation) is
medadapt's code as it runs on GPUs. With one process torch turns ``FULL_SHARD`` into ``NO_SHARD``; with two
each process holds half of every flat parameter.

The recipes are the tiny CPU twins on random tiny models built here with the test suite's builders
(``tests/conftest.py``, ``tests/test_care_model.py``): ``care-tiny-init.yaml`` (six phases, RetroMAE included),
``hyrec-tiny.yaml`` with its RetroMAE pre-training, ``med-moe-embed-tiny.yaml``. CARE's query-tower
RetroMAE and unsupervised phases keep the recipe's GradCache accumulation (2 chunks of 4). Each row: recipe, processes, engine, the FSDP units of
each wrap, losses, metrics, seconds; ``table`` compares each FSDP row with the plain row of the same recipe
and process count. Both runs of a recipe share one launch (plain first, then FSDP), so the FSDP run's
seconds (in the JSON) skip one-time costs and are no speed comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"


def _overrides(name: str, d: Path) -> list[str]:
    bert, qwen, beir = d / "bert" / "st", d / "qwen" / "qwen2", d / "beir"
    common = [f"data.path={beir}", "training.device=cpu"]
    if name == "care-tiny-init":
        return [f"document.model={qwen}", f"query.model={bert}", *common]  # its GradCache accumulation kept
    if name == "hyrec-tiny":
        return [f"model.backbone={bert}", *common, "pretrain.epochs=2", "pretrain.batch_size=8",
                "pretrain.lr=3e-3", "pretrain.warmup_ratio=0"]
    if name == "med-moe-embed-tiny":
        return [f"model.backbone={bert}", *common, "data.hard_negatives.window=[2,6]", "head.expansion=1",
                "training.batch_size=4", "training.shared_epochs=3", "training.random_routing_epochs=1",
                "training.epochs=6", "eval.split=test"]
    raise SystemExit(f"unknown recipe {name}")


RECIPE_NAMES = ["care-tiny-init", "hyrec-tiny", "med-moe-embed-tiny"]


def prepare(d: Path) -> None:
    """Random tiny BERT (sentence-transformers folder), tiny Qwen2 and a tiny BEIR folder under ``d``."""
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import build_tiny_beir, build_tiny_bert, build_tiny_qwen2

    if not (d / "bert" / "st").exists():
        build_tiny_bert(d / "bert")
    if not (d / "qwen" / "qwen2").exists():
        build_tiny_qwen2(d / "qwen")
    if not (d / "beir").exists():
        build_tiny_beir(d / "beir")


def worker(args: argparse.Namespace) -> None:
    """One process of one run (``torchrun``); rank 0 writes the row."""
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    import medadapt.recipes.run as run_module
    from medadapt.cache import EmbeddingCache
    from medadapt.recipes import run_recipe

    wraps: list[list] = []
    make = run_module._accelerator

    class State:
        def __init__(self, real, plugin):
            self._real, self.fsdp_plugin = real, plugin

        def __getattr__(self, key):
            return None if key == "deepspeed_plugin" else getattr(self._real, key)

    class CpuFsdp:
        """An Accelerator whose prepare_model is Accelerate's FSDP1 branch, on CPU."""

        distributed_type = "DistributedType.FSDP"

        def __init__(self, real):
            from accelerate.utils import FullyShardedDataParallelPlugin

            self._real = real
            self.state = State(real.state, FullyShardedDataParallelPlugin(
                fsdp_version=1, auto_wrap_policy="transformer_based_wrap", use_orig_params=True))

        def __getattr__(self, key):
            return getattr(self._real, key)

        def prepare_model(self, model, **kwargs):
            plugin = self.state.fsdp_plugin
            plugin.set_auto_wrap_policy(model)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                wrapped = FSDP(model, auto_wrap_policy=plugin.auto_wrap_policy, ignored_modules=plugin.ignored_modules,
                               use_orig_params=True, device_id=torch.device("cpu"))
            wraps.append([type(model).__name__, sum(isinstance(m, FSDP) for m in wrapped.modules())])
            self._real._models.append(wrapped)
            return wrapped

        def prepare_optimizer(self, optimizer):
            return optimizer

    processes = args.processes[0]
    for engine in args.engines:  # one launch for both: the process start and imports are paid once
        run_module._accelerator = (lambda recipe: CpuFsdp(make(recipe))) if engine == "fsdp" else make
        wraps.clear()
        out = Path(args.dir) / "runs" / f"{args.recipe}-{engine}-{processes}"
        t0 = time.perf_counter()
        res = run_recipe(RECIPES / f"{args.recipe}.yaml", out, _overrides(args.recipe, Path(args.dir)),
                         cache=EmbeddingCache(str(out) + ".cache"), show_progress=False, log=lambda m: None,
                         overwrite=True)
        if int(os.environ.get("RANK", "0")) == 0:
            row = {"recipe": args.recipe, "engine": engine, "processes": processes, "wraps": list(wraps),
                   "losses": [r["loss"] for r in res.loss_history], "metrics": res.metrics,
                   "seconds": round(time.perf_counter() - t0, 1)}
            with open(args.rows, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")


def launch(args: argparse.Namespace, recipe: str, processes: int, port: int) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
           "--master_port", str(port), __file__, "run", "--dir", str(args.dir), "--recipe", recipe,
           "--engines", "plain", "fsdp", "--processes", str(processes), "--rows", str(args.rows)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"{recipe} on {processes} processes failed ({proc.returncode})")


def table(rows: list[dict]) -> str:
    plain = {(r["recipe"], r["processes"]): r for r in rows if r["engine"] == "plain"}
    lines = ["| recipe | processes | FSDP units per wrap | steps | max loss difference | first step that differs "
             "(> 1e-5) | metric (plain / FSDP) |", "|---|---:|---|---:|---:|---:|---|"]
    for r in rows:
        if r["engine"] != "fsdp" or (r["recipe"], r["processes"]) not in plain:
            continue
        p = plain[(r["recipe"], r["processes"])]
        diffs = [abs(a - b) for a, b in zip(p["losses"], r["losses"])]
        first = next((i + 1 for i, x in enumerate(diffs) if x > 1e-5), "-")
        key = next(k for k in r["metrics"] if k.endswith("ndcg@10"))
        units = ", ".join(f"{n} {u}" for n, u in r["wraps"])
        lines.append(f"| {r['recipe']} | {r['processes']} | {units} | {len(diffs)} | {max(diffs):.1e} | {first} | "
                     f"{key} {p['metrics'][key]:.4f} / {r['metrics'][key]:.4f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["all", "run", "table"])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/fsdp_cpu"))
    ap.add_argument("--recipe", choices=RECIPE_NAMES)
    ap.add_argument("--recipes", nargs="+", default=RECIPE_NAMES)
    ap.add_argument("--engines", nargs="+", choices=["plain", "fsdp"], default=["plain", "fsdp"])
    ap.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rows", type=Path)
    ap.add_argument("--output", type=Path)
    args = ap.parse_args()
    args.rows = args.rows or args.dir / "rows.jsonl"
    if args.command == "run":
        worker(args)
        return
    if args.command == "all":
        args.dir.mkdir(parents=True, exist_ok=True)
        prepare(args.dir)
        args.rows.unlink(missing_ok=True)
        port = 29700 + os.getpid() % 200
        for processes in args.processes:
            for recipe in args.recipes:
                port += 1
                launch(args, recipe, processes, port)
    rows = [json.loads(line) for line in args.rows.read_text(encoding="utf-8").splitlines() if line.strip()]
    print(table(rows))
    if args.output is not None:
        args.output.write_text(json.dumps({"command": " ".join(sys.argv), "machine": "2-core CPU, torch "
                                           + __import__("torch").__version__, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
