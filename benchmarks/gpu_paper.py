"""The paper recipes on one GPU through the real bf16 / DeepSpeed / FSDP paths, with `medadapt plan`'s
estimate beside what was measured (issue 16 item 5).

    python benchmarks/gpu_paper.py all --dir /tmp/gp --engines single deepspeed fsdp --output gpu_paper.json

Every run is a shipped paper recipe (``care.yaml``, ``hyrec.yaml``, ``bmretriever-{410m,1b,2b,7b}.yaml``,
``med-moe-embed-paper.yaml``) with ``--set`` overrides that only swap what cannot exist offline or in a few
minutes:

* **models**: randomly initialised models built from the architecture configs that ship in
  ``recipes/configs`` (full width, heads, vocabulary); the layer count is cut where ``LAYERS`` says so, to fit
  the device time (``--full`` keeps every layer). ``gte-multilingual-base`` needs remote code, so the CARE
  query tower is a BERT of its width, depth and vocabulary; Med-MoE-Embed's backbone is a BERT of MiniLM's
  shape. Tokenizers are word-level over a synthetic vocabulary (one word = one token).
* **data**: a synthetic BEIR folder (English words; Chinese characters for HyReC) whose documents are
  longer than every maximum sequence length, queries drawn from their document's words; BMRetriever's
  synthetic stages use the deterministic ``fake`` generator, HyReC's preliminary pairs are the folder's
  train pairs scored by a random ``bge-small-zh`` shape.
* **schedule**: each stage stops after ``--max-steps`` optimiser steps at the batch sizes in ``BATCH``,
  without gradient accumulation unless ``--accumulation K`` (CARE and HyReC: K GradCache chunks of that
  batch per step, under no engine or FSDP; the loop refuses it under DeepSpeed). With K > 1, tokens/s
  counts each token once although GradCache runs every chunk twice (a step's repeated tokeniser inputs are
  counted once).

medadapt must be installed (its recipe kinds register through entry points). Each engine is one
``accelerate launch`` of this file's ``run`` command (one process, one GPU): ``single``
(no distributed engine), ``deepspeed`` (ZeRO stage 2) or ``fsdp`` (FULL_SHARD), all bf16. Per training stage
the worker records optimiser steps, wall seconds after the first step, tokens through the tokenizer during
the steps (non-padding tokens of tensor batches, i.e. model inputs), and the CUDA allocator's peak
(``max_memory_allocated``, reset at the stage's first step); ``medadapt plan`` on the same recipe and
overrides gives the estimate per phase (same batch, one GPU of 80 GB, the engine's sharding). Results are one
JSON row per recipe and engine (its stages inside), appended to ``--rows`` as they come; ``table`` prints one
line per stage. The ``deepspeed`` engine needs the ``deepspeed`` package.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

# recipe -> (file, {override key: model folder name}) ; folder names are keys of ARCHS
RECIPES: dict[str, tuple[str, dict[str, str]]] = {
    "care": ("care.yaml", {"document.model": "qwen3-4b", "query.model": "gte-base-shape"}),
    "hyrec": (
        "hyrec.yaml",
        {
            "model.backbone": "bge-base-zh",
            "negatives.miner": "bge-small-zh",
            "prefinetune.scorer": "bge-small-zh",
        },
    ),
    "moe": ("med-moe-embed-paper.yaml", {"model.backbone": "minilm-shape"}),
    "bm-410m": (
        "bmretriever-410m.yaml",
        {"model.name": "pythia-410m", "stage2.base_retriever": "minilm-shape"},
    ),
    "bm-1b": ("bmretriever-1b.yaml", {"model.name": "pythia-1b", "stage2.base_retriever": "minilm-shape"}),
    "bm-2b": ("bmretriever-2b.yaml", {"model.name": "gemma-2b", "stage2.base_retriever": "minilm-shape"}),
    "bm-7b": (
        "bmretriever-7b.yaml",
        {"model.name": "biomistral-7b", "stage2.base_retriever": "minilm-shape"},
    ),
}
# model folder -> (recipes/configs folder or None for a BERT given here, decoder?, layers kept by default)
ARCHS: dict[str, tuple[str | None, bool, int | None]] = {
    "qwen3-4b": ("Qwen3-4B", True, 8),
    "gte-base-shape": (None, False, None),
    "bge-base-zh": ("bge-base-zh-v1.5", False, None),
    "bge-small-zh": ("bge-small-zh-v1.5", False, None),
    "minilm-shape": (None, False, None),
    "pythia-410m": ("pythia-410m", True, None),
    "pythia-1b": ("pythia-1b", True, None),
    "gemma-2b": ("gemma-2b", True, None),
    "biomistral-7b": ("BioMistral-7B", True, 8),
}
BERTS = {  # BERT shapes standing in for configs we cannot build offline
    "gte-base-shape": dict(
        vocab_size=250048,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=8192,
    ),
    "minilm-shape": dict(
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
    ),
}
# per-recipe batch sizes (global = per GPU here): one H100 ran them at 0.8-5 steps/s
BATCH: dict[str, list[str]] = {
    "care": [
        "init.query.pretrain.batch_size=32",
        "init.query.pretrain.gradient_accumulation_steps=1",
        "init.query.unsupervised.batch_size=64",
        "init.query.unsupervised.gradient_accumulation_steps=1",
        "init.query.batch_size=16",
        "init.document.batch_size=8",
        "stage1.batch_size=64",
        "stage2.batch_size=8",
    ],
    "hyrec": ["pretrain.batch_size=64", "prefinetune.batch_size=64", "training.batch_size=64"],
    "moe": ["training.batch_size=32"],
    **{
        k: ["stage1.batch_size=16", "stage2.batch_size=16", "stage1.warmup_steps=5", "stage2.warmup_steps=5"]
        for k in ("bm-410m", "bm-1b", "bm-2b", "bm-7b")
    },
}
STEP_KEYS: dict[str, list[str]] = {
    "care": [
        "init.query.pretrain",
        "init.query.unsupervised",
        "init.query",
        "init.document",
        "stage1",
        "stage2",
    ],
    "hyrec": ["pretrain", "prefinetune", "training"],
    "moe": ["training"],
    **{k: ["stage1", "stage2"] for k in ("bm-410m", "bm-1b", "bm-2b", "bm-7b")},
}
# loop / trainer stage -> the plan phase it is (plan phase names start with these)
PHASE_OF = {
    "init_query_pretrain": "init query: RetroMAE",
    "init_query_unsupervised": "init query: unsupervised",
    "init_query": "init query",
    "init_document": "init document",
    "stage1": "stage I",
    "stage2": "stage II",
    "pretrain": "RetroMAE pre-training",
    "prefinetune": "preliminary fine-tuning",
    "hyrec": "fine-tuning",
    "shared": "training",
    "random": "training",
    "learned": "training",
    "bm_stage1": "stage I",
    "bm_stage2": "stage II",
}
ENGINES = {
    "single": {"distributed_type": "NO"},
    "deepspeed": {
        "distributed_type": "DEEPSPEED",
        "deepspeed_config": {
            "zero_stage": 2,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": 1.0,
            "offload_optimizer_device": "none",
            "offload_param_device": "none",
            "zero3_init_flag": False,
        },
    },
    "fsdp": {
        "distributed_type": "FSDP",
        "fsdp_config": {
            "fsdp_version": 1,
            "fsdp_sharding_strategy": "FULL_SHARD",
            "fsdp_auto_wrap_policy": "NO_WRAP",
            "fsdp_backward_prefetch": "BACKWARD_PRE",
            "fsdp_state_dict_type": "FULL_STATE_DICT",
            "fsdp_offload_params": False,
            "fsdp_sync_module_states": True,
            "fsdp_use_orig_params": True,
            "fsdp_cpu_ram_efficient_loading": False,
            "fsdp_activation_checkpointing": False,
        },
    },
}


# ----------------------------------------------------------------------------------------------- prepare
def _words(n: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    out: set[str] = set()
    while len(out) < n:
        out.add("".join(rng.choice(letters) for _ in range(rng.randint(3, 9))))
    return sorted(out)


def _cjk(n: int) -> list[str]:
    return [chr(0x4E00 + i * 7) for i in range(n)]


def _beir(path: Path, vocab: list[str], n_docs: int, doc_len: int, q_len: int, sep: str, seed: int) -> None:
    """A BEIR folder: documents of ``doc_len`` tokens, one query per document (``q_len`` of its tokens in
    random order), 70 / 15 / 15 train / dev / test."""
    import random

    rng = random.Random(seed)
    path.mkdir(parents=True, exist_ok=True)
    (path / "qrels").mkdir(exist_ok=True)
    docs, queries, qrels = [], [], {"train": [], "dev": [], "test": []}
    for i in range(n_docs):
        topic = rng.sample(vocab, 40)
        text = [rng.choice(topic) if rng.random() < 0.5 else rng.choice(vocab) for _ in range(doc_len)]
        docs.append({"_id": f"d{i}", "title": sep.join(topic[:8]), "text": sep.join(text)})
        queries.append({"_id": f"q{i}", "text": sep.join(rng.sample(topic, min(q_len, 40)))})
        split = "train" if i % 20 < 14 else "dev" if i % 20 < 17 else "test"
        qrels[split].append(f"q{i}\td{i}\t1")
    with open(path / "corpus.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(d, ensure_ascii=False) + "\n" for d in docs)
    with open(path / "queries.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(q, ensure_ascii=False) + "\n" for q in queries)
    for split, rows in qrels.items():
        (path / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")


def _tokenizer(vocab: list[str], decoder: bool, max_len: int, padding_side: str):
    """Word-level tokenizer over ``vocab`` (CJK characters split one per token, as BERT's normaliser does)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<|endoftext|>"]
    table = {t: i for i, t in enumerate(specials + vocab)}
    tok = Tokenizer(models.WordLevel(vocab=table, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, handle_chinese_chars=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    if decoder:
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            eos_token="<|endoftext|>",
            pad_token="<|endoftext|>",
            unk_token="[UNK]",
            model_max_length=max_len,
            padding_side=padding_side,
        )
    tok.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=max_len,
    )


def build_model(name: str, out: Path, vocab: list[str], *, layers: int | None, device: str) -> dict:
    """A random model of architecture ``name`` (see ``ARCHS``) with a word-level tokenizer, saved in bf16 for
    decoders (the recipes load them so) and float32 for encoders."""
    import torch
    from transformers import AutoConfig, AutoModel, BertConfig

    src, decoder, default_layers = ARCHS[name]
    layers = layers if layers is not None else default_layers
    if src is None:
        cfg = BertConfig(**BERTS[name])
    else:
        raw = json.loads((ROOT / "recipes" / "configs" / src / "config.json").read_text())
        raw.pop("auto_map", None)
        cfg = AutoConfig.for_model(
            raw.pop("model_type"),
            **{k: v for k, v in raw.items() if k not in ("architectures", "transformers_version")},
        )
    full_layers = cfg.num_hidden_layers
    if layers is not None and layers < cfg.num_hidden_layers:
        cfg.num_hidden_layers = layers
        if hasattr(cfg, "layer_types") and cfg.layer_types:
            cfg.layer_types = cfg.layer_types[:layers]
    dtype = torch.bfloat16 if decoder else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModel.from_config(cfg, torch_dtype=dtype)
    model.save_pretrained(out, safe_serialization=True)
    _tokenizer(vocab, decoder, 512, "left").save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {
        "model": name,
        "config": src or "BERT shape",
        "layers": cfg.num_hidden_layers,
        "of": full_layers,
        "params": n,
    }


def prepare(args) -> None:
    import yaml

    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    en, zh = _words(6000, 0), _cjk(3000)
    doc_len, q_len = (600, 32) if not args.smoke else (40, 8)
    _beir(base / "beir-en", en, args.docs, doc_len, q_len, " ", 1)
    _beir(base / "beir-zh", zh, args.docs, doc_len, q_len, "", 2)
    device = "cuda" if _cuda() else "cpu"
    need = {m for r in args.recipes for m in RECIPES[r][1].values()}
    built = []
    for name in sorted(need):
        out = base / "models" / name
        if (out / "config.json").is_file():
            continue
        t0 = time.perf_counter()
        layers = 2 if args.smoke else (None if args.full else ARCHS[name][2])
        info = build_model(name, out, zh if "zh" in name else en, layers=layers, device=device)
        info["build_seconds"] = round(time.perf_counter() - t0, 1)
        built.append(info)
        print("built", info, flush=True)
    with open(base / "models.json", "a", encoding="utf-8") as f:
        f.writelines(json.dumps(b) + "\n" for b in built)
    for engine, extra in ENGINES.items():
        cfg = {
            "compute_environment": "LOCAL_MACHINE",
            "num_machines": 1,
            "num_processes": 1,
            "machine_rank": 0,
            "mixed_precision": "bf16",
            "main_training_function": "main",
            "rdzv_backend": "static",
            "same_network": True,
            "use_cpu": False,
            "gpu_ids": "all",
            **extra,
        }
        (base / f"accelerate-{engine}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


#: sections of the recipes trained by medadapt's own loop that take ``--accumulation`` (GradCache chunks);
#: HyReC's preliminary fine-tuning accumulates as its main stage does
ACCUMULATION_KEYS: dict[str, list[str]] = {"care": STEP_KEYS["care"], "hyrec": ["pretrain", "training"]}


def overrides(recipe: str, base: Path, max_steps: int, smoke: bool, accumulation: int = 1) -> list[str]:
    _, models = RECIPES[recipe]
    out = [f"{k}={base / 'models' / v}" for k, v in models.items()]
    out += BATCH[recipe] + [f"{k}.max_steps={max_steps}" for k in STEP_KEYS[recipe]]
    if accumulation > 1 and recipe in ACCUMULATION_KEYS:  # BATCH is then the chunk: the step is K chunks
        out += [f"{k}.gradient_accumulation_steps={accumulation}" for k in ACCUMULATION_KEYS[recipe]]
    out += ["training.checkpoint_every_steps=100000"]
    data = base / ("beir-zh" if recipe == "hyrec" else "beir-en")
    out.append(f"data.path={data}")
    if recipe == "hyrec":
        out += ["pretrain.data=null", f"prefinetune.data={data}"]
    if recipe.startswith("bm-"):
        out += [
            "stage1.sources=[]",
            "stage1.max_pairs=null",
            "stage2.tasks=[{name: medquad, split: train}]",
            "stage2.synthetic={generator: fake, passages: 64, top_k: 3, instruction: pubmed}",
            "stage2.task_synthetic={generator: fake, tasks: 16, per_call: 8}",
            "eval.instruction=medquad",
        ]
    if smoke:  # CPU check of the wiring: short sequences, fp32
        out += ["training.mixed_precision=no"]
        if recipe == "care":
            out += [
                "document.max_seq_length=32",
                "query.max_seq_length=32",
                "init.max_length=32",
                "stage1.max_length=32",
                "init.query.pretrain.max_length=32",
                "init.query.unsupervised.max_length=32",
                "document.torch_dtype=float32",
            ]
        elif recipe.startswith("bm-"):
            out += ["model.max_seq_length=32", "model.torch_dtype=float32"]
        elif recipe == "hyrec":
            out += ["model.passage_max_length=32", "pretrain.max_length=32"]
    return out


# ------------------------------------------------------------------------------------------------ worker
class Probe:
    """Per training stage: steps, seconds after the first step, tokens tokenised inside the steps, and the
    CUDA allocator's peak. Wraps the one loop's step and the transformers Trainer's ``training_step`` (the
    sentence-transformers trainer paths) and ``PreTrainedTokenizerBase.__call__``; nothing else changes."""

    def __init__(self):
        self.stages: list[dict] = []
        self.in_step = False
        self.window: str | None = None
        self.current: dict | None = None
        self.step_texts: set[int] = set()  # tokeniser inputs of the current step (GradCache passes counted once)

    def _stage(self, name: str) -> dict:
        import torch

        if self.current is None or self.current["stage"] != name:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            self.current = {
                "stage": name,
                "steps": 0,
                "tokens": 0,
                "tokens_first": 0,
                "t_first_end": None,
                "t_end": None,
                "peak_bytes": 0,
                "reserved_bytes": 0,
                "first_loss": None,
                "last_loss": None,
            }
            self.stages.append(self.current)
        return self.current

    def _end(self, st: dict, loss) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
            st["peak_bytes"] = max(st["peak_bytes"], torch.cuda.max_memory_allocated())
            st["reserved_bytes"] = max(st["reserved_bytes"], torch.cuda.max_memory_reserved())
        now = time.perf_counter()
        st["steps"] += 1
        st["t_end"] = now
        if st["steps"] == 1:
            st["t_first_end"] = now
            st["tokens_first"] = st["tokens"]
            st["first_loss"] = loss
        st["last_loss"] = loss
        st["tokens_last"] = st["tokens"]

    def install(self) -> None:
        import torch
        import transformers
        from transformers import PreTrainedTokenizerBase

        import medadapt.training.loop as loop

        probe = self
        one_step = loop._one_step

        def step(stage, *a, **k):
            st = probe._stage(stage.name)
            st["accumulation"] = stage.optim.gradient_accumulation_steps
            probe.step_texts = set()
            probe.in_step = True
            try:
                row = one_step(stage, *a, **k)
            finally:
                probe.in_step = False
            probe._end(st, row.get("loss"))
            return row

        loop._one_step = step
        training_step = transformers.Trainer.training_step

        def tstep(trainer, *a, **k):
            st = probe._stage(probe.window or "trainer")
            probe.in_step = True
            try:
                out = training_step(trainer, *a, **k)
            finally:
                probe.in_step = False
            probe._end(st, float(out.detach().float()) if hasattr(out, "detach") else None)
            return out

        transformers.Trainer.training_step = tstep
        call = PreTrainedTokenizerBase.__call__

        def tok_call(tok, *a, **k):
            enc = call(tok, *a, **k)
            if probe.current is not None and probe.in_step and probe.current.get("accumulation", 1) > 1:
                # GradCache runs each chunk twice; a step that tokenises a chunk in both passes (CARE) counts it
                # once, one that tokenises the whole step once and caches it (HyReC) is counted as it is
                key = hash(repr(a[0] if a else k.get("text")))
                if key in probe.step_texts:
                    return enc
                probe.step_texts.add(key)
            if probe.current is not None and (probe.in_step or probe.window):
                mask = enc.get("attention_mask") if hasattr(enc, "get") else None
                if isinstance(mask, torch.Tensor):  # model inputs (lists: labels, filters, not a forward)
                    probe.current["tokens"] += int(mask.sum())
            return enc

        PreTrainedTokenizerBase.__call__ = tok_call

    def rows(self) -> list[dict]:
        out = []
        for st in self.stages:
            secs = (st["t_end"] - st["t_first_end"]) if st["steps"] > 1 else None
            toks = st.get("tokens_last", 0) - st["tokens_first"]  # between the first and the last step's end
            out.append(
                {
                    "stage": st["stage"],
                    "steps": st["steps"],
                    "seconds": round(secs, 2) if secs else None,
                    "steps_per_s": round((st["steps"] - 1) / secs, 3) if secs else None,
                    "tokens_per_s": round(toks / secs) if secs and toks else None,
                    "accumulation": st.get("accumulation", 1),
                    "peak_gib": round(st["peak_bytes"] / 2**30, 2),
                    "reserved_gib": round(st["reserved_bytes"] / 2**30, 2),
                    "first_loss": st["first_loss"],
                    "last_loss": st["last_loss"],
                }
            )
        return out


def _plan(recipe_file: Path, ovr: list[str], accel: Path) -> list[dict]:
    from medadapt.plan import plan_recipe
    from medadapt.plan.hardware import read_accelerate_config
    from medadapt.recipes.loader import load_recipe

    hw = read_accelerate_config(accel).with_overrides(gpu_memory_gb=80)
    plan = plan_recipe(load_recipe(recipe_file, ovr), hw, strict=False)
    return [
        {
            "phase": p.name,
            "batch": p.global_batch,
            "micro_batch": p.micro_batch,
            "accumulation": p.accumulation,
            "tokens_per_step": p.tokens_per_step,
            "plan_peak_gib": round(p.peak_gb, 2),  # at the micro-batch the plan picks (the largest that fits)
            # at the run's own chunk (batch_size per device): what the run holds with --accumulation K
            "plan_peak_run_chunk_gib": round(p.state_gb + p.embeddings_gb + math.ceil(
                p.declared_batch_size / hw.num_gpus) * p.activations_per_example_gb, 2),
            "fits": p.fits,
            "checkpointing": p.checkpointing,
        }
        for p in plan.phases
    ]


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in (
        "torch",
        "transformers",
        "sentence-transformers",
        "accelerate",
        "peft",
        "deepspeed",
        "medadapt",
    ):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "-"
    return out


def run(args) -> None:
    """One engine (this process was started by ``accelerate launch``): every recipe in turn."""
    import torch

    from medadapt.cache import EmbeddingCache
    from medadapt.recipes import run_recipe

    base = Path(args.dir)
    accel = base / f"accelerate-{args.engine}.yaml"
    probe = Probe()
    probe.install()
    for recipe in args.recipes:
        file = ROOT / "recipes" / RECIPES[recipe][0]
        ovr = overrides(recipe, base, args.max_steps, args.smoke, args.accumulation)
        row = {
            "engine": args.engine,
            "recipe": recipe,
            "file": file.name,
            "overrides": ovr,
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "versions": _versions(),
        }
        try:
            row["plan"] = _plan(file, ovr, accel)
        except Exception as exc:  # the plan is a comparison: a failure is recorded, the run still goes
            row["plan_error"] = f"{type(exc).__name__}: {exc}"
        probe.stages, probe.current, probe.window = [], None, None
        t0 = time.perf_counter()
        try:
            res = run_recipe(
                file,
                base / "runs" / f"{recipe}-{args.engine}",
                ovr,
                overwrite=True,
                cache=EmbeddingCache(base / "cache"),
                show_progress=False,
                log=lambda m: print(f"  [{recipe} +{time.perf_counter() - t0:.1f}s] {m}", flush=True),
            )
            row["metrics"] = {k: round(float(v), 4) for k, v in (res.metrics or {}).items()}
            row["train_seconds"], row["encode_seconds"] = (
                round(res.train_seconds, 1),
                round(res.encode_seconds, 1),
            )
            row["ok"] = True
        except Exception as exc:
            row["ok"] = False
            row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            row["traceback"] = traceback.format_exc()[-4000:]
            print(row["traceback"], flush=True)
        row["wall_seconds"] = round(time.perf_counter() - t0, 1)
        row["stages"] = probe.rows()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        print(json.dumps({k: v for k, v in row.items() if k not in ("overrides", "traceback")}), flush=True)
        with open(args.rows, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


# ------------------------------------------------------------------------------------------------ driver
def launch(args, engine: str) -> int:
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(Path(args.dir) / f"accelerate-{engine}.yaml"),
        str(Path(__file__).resolve()),
        "run",
        "--dir",
        str(args.dir),
        "--engine",
        engine,
        "--rows",
        str(args.rows),
        "--max-steps",
        str(args.max_steps),
        "--accumulation",
        str(args.accumulation),
        "--recipes",
        *args.recipes,
    ] + (["--smoke"] if args.smoke else [])
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    print("$", " ".join(cmd), flush=True)
    return subprocess.call(cmd, env=env, timeout=args.timeout)


def _phase(stage: str, plan: list[dict]) -> dict:
    want = PHASE_OF.get(stage)
    exact = [p for p in plan if p["phase"] == want]
    loose = [p for p in plan if want and p["phase"].startswith(want)]
    return (exact or loose or [{}])[0]


def table(rows_file: Path) -> list[dict]:
    out = []
    for line in rows_file.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        plan = r.get("plan") or []
        for i, st in enumerate(r.get("stages") or [{}]):
            p = _phase(st.get("stage", ""), plan)
            out.append(
                {
                    "engine": r["engine"],
                    "recipe": r["recipe"],
                    "stage": st.get("stage", "-"),
                    "plan phase": p.get("phase", "-"),
                    "steps": st.get("steps"),
                    "tokens/s": st.get("tokens_per_s"),
                    "steps/s": st.get("steps_per_s"),
                    "peak GiB": st.get("peak_gib"),
                    "plan GiB": p.get("plan_peak_run_chunk_gib", p.get("plan_peak_gib")),
                    "first loss": st.get("first_loss"),
                    "last loss": st.get("last_loss"),
                    "ok": r.get("ok") if i == 0 else "",
                    "error": (r.get("error") or "")[:120] if i == 0 else "",
                }
            )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=["prepare", "run", "all", "table"])
    p.add_argument("--dir", type=Path, default=Path("/tmp/medadapt-gpu-paper"))
    p.add_argument("--recipes", nargs="*", default=list(RECIPES))
    p.add_argument("--engines", nargs="*", default=["single"], choices=list(ENGINES))
    p.add_argument("--engine", default="single", choices=list(ENGINES))
    p.add_argument("--max-steps", type=int, default=40, help="optimiser steps per stage")
    p.add_argument("--accumulation", type=int, default=1,
                   help="GradCache chunks per optimiser step for the loop's recipes (care, hyrec); the batch "
                        "sizes in BATCH are then the chunk")
    p.add_argument(
        "--docs", type=int, default=512, help="documents (= queries) in each synthetic BEIR folder"
    )
    p.add_argument("--full", action="store_true", help="keep every layer of the paper architectures")
    p.add_argument("--smoke", action="store_true", help="CPU wiring check: one layer, short sequences, fp32")
    p.add_argument("--rows", type=Path, default=None, help="JSONL of per-recipe rows (appended)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per engine launch")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args()
    args.rows = args.rows or args.dir / "rows.jsonl"
    if args.command == "prepare":
        prepare(args)
    elif args.command == "run":
        run(args)
    elif args.command == "all":
        prepare(args)
        for engine in args.engines:
            try:
                launch(args, engine)
            except subprocess.TimeoutExpired:
                print(f"engine {engine}: timed out", flush=True)
    if args.command in ("all", "table"):
        from _common import finish

        rows = table(args.rows)
        finish(
            args,
            rows,
            [
                "engine",
                "recipe",
                "stage",
                "plan phase",
                "steps",
                "tokens/s",
                "steps/s",
                "peak GiB",
                "plan GiB",
                "first loss",
                "last loss",
                "ok",
                "error",
            ],
        )


if __name__ == "__main__":
    main()
