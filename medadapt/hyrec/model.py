"""The HyReC model (§3.1: GLAE, weight / union / dense projectors, bagging) as one sentence-transformers model.

The lexical side is :class:`LexicalBranch`, the last module of the model, saved and loaded with it
(``SentenceTransformer(folder, trust_remote_code=True)``, ``medadapt.load``). It leaves ``sentence_embedding``
unchanged (the dense side and the EmbeddingCache work as without it); the sparse side reads the token states of
the branch tower (the ``Transformer``, or an asymmetric model's document route, for queries too), so it is
computed by :class:`HyReCModel`, the training and encoding view that ``LexicalBranch.as_encoder`` gives
retrieval: ``encode_query`` / ``encode_document`` (dense) and ``encode_lexical`` (``{term_id: weight}``:
tokenizer terms and bagged words, L2-normalised; padding, special and unknown tokens never become terms).
A folder of the old layout (a ``hyrec/`` side folder) is appended on load and saved in the new one.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

try:
    from typing import Self
except ImportError:  # pragma: no cover - Python < 3.11
    from typing_extensions import Self

import numpy as np
import torch
from sentence_transformers.base.modules import Module
from torch import Tensor, nn

from medadapt.adapters.compose import base_kind
from medadapt.adapters.files import ADAPTER_FOLDER, write_adapter
from medadapt.checksums import SUMS, ChecksumError, verify_sums, write_sums
from medadapt.domains import domain_mix, domain_probabilities
from medadapt.errors import ConfigError, ModelLoadError, warn
from medadapt.hyrec.bagging import WordVocab, group_words, sparse_from_tokens
from medadapt.hyrec.data import UnionLabelCache
from medadapt.hyrec.glae import (
    embed,
    encoder_layers,
    extended_mask,
    run_layers,
    split_layers,
    truncate_layers,
)
from medadapt.hyrec.labels import IGNORE, S
from medadapt.hyrec.normalize import normalize_sparse
from medadapt.hyrec.projectors import DenseProjector, UnionProjector, WeightProjector
from medadapt.identity import modules_fingerprint, tokenizer_fingerprint
from medadapt.io import atomic_save_tensors, atomic_write_json, replace_folder
from medadapt.models import SIDE_MODULES, load
from medadapt.progress import progress
from medadapt.retrieval.tokenize import cjk_characters

__all__ = ["HyReCConfig", "HyReCModel", "LexicalBranch", "HYREC_FORMAT"]

#: 2: ``SHA256SUMS`` covers the lexical files (a ``hyrec/`` side folder of format 1, written before it, loads
#: with a warning; the config is the same).
HYREC_FORMAT = 2
#: The side folder of the old layout, and of adapter-only folders (beside the adapter files).
SUBDIR = "hyrec"
#: The lexical side's files, covered by its ``SHA256SUMS``.
LEXICAL_FILES = ("lexical.safetensors", "words.json", "config.json")
Role = Literal["query", "document"]


@dataclass
class HyReCConfig:
    """Architecture and inference settings (docs/hyrec.md).

    ``branch_layers``: N, layers of the lexicon and dense encoders (``lexicon_layers``: fewer copied into the
    lexicon encoder); ``variant``: ``full`` or ``frozen`` (sharing backbone frozen); ``pooling``: ``cls`` (eq. 6)
    or ``mean``; ``union``: predict the semantic union and bag words; learned words get ids in
    ``n_word_buckets`` above the vocabulary, keep their tokens with ``keep_subterms`` and need union probability
    ``min_union``; ``query_max_length`` / ``passage_max_length``: token limits (``dense_max_length``: of the
    dense side encoding alone); ``dense_weight``: eq. 9's weight; ``language``: of the union labels;
    ``term_bias``: a learned per-term prior in the weight projector; ``union_source``: ``learned`` (eq. 7-8) or
    ``labels`` (jieba + regex); ``union_context``: 0 = the linear union projector (eq. 4), k = an MLP over a
    window of 2k + 1 states. The last three are not in the paper. ``domains`` / ``domain_dense_weights``: a
    fusion weight per domain of a ``data.mix`` (chosen on each domain's dev split) that a domain classifier on
    the frozen pooled embedding mixes per query (:meth:`HyReCModel.lexical_query_scale`); empty: one
    ``dense_weight``.
    """

    branch_layers: int = 1
    variant: Literal["full", "frozen"] = "full"
    pooling: Literal["cls", "mean"] = "cls"
    union: bool = True
    n_word_buckets: int = 2**20
    keep_subterms: bool = True
    min_union: float = 0.0
    query_max_length: int = 64
    passage_max_length: int = 256
    dense_weight: float = 1.0
    language: Literal["zh", "en"] = "zh"
    dense_max_length: int | None = None
    lexicon_layers: int | None = None
    term_bias: bool = False
    union_source: Literal["learned", "labels"] = "learned"
    union_context: int = 0
    domains: list[str] = dataclasses.field(default_factory=list)
    domain_dense_weights: list[float] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = {**dataclasses.asdict(self), "format_version": HYREC_FORMAT}
        if not self.domains:  # without them the dict (and every fingerprint over it) is what it was before
            del out["domains"], out["domain_dense_weights"]
        return out

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> HyReCConfig:
        obj = dict(obj)
        version = obj.pop("format_version", HYREC_FORMAT)
        if version not in (1, HYREC_FORMAT):
            raise ModelLoadError(f"unsupported HyReC format version {version} "
                                 f"(this medadapt reads 1 and {HYREC_FORMAT})")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise ModelLoadError(f"unknown HyReC config keys: {', '.join(unknown)}")
        return cls(**obj)


def branch_tower(st_model):
    """The ``Transformer`` the lexical branch reads: the model's first module, or for an asymmetric model its
    document route's first module."""
    route = _document_route(st_model)
    return route[0] if route is not None else st_model[0]


def find_branch(st_model) -> LexicalBranch | None:
    """The model's :class:`LexicalBranch` module, if it has one."""
    return next((m for m in getattr(st_model, "_modules", {}).values() if isinstance(m, LexicalBranch)), None)


def dense_modules(st_model) -> list:
    """The model's modules without its lexical branch (what the dense side runs)."""
    return [m for m in st_model._modules.values() if not isinstance(m, LexicalBranch)]


class LexicalBranch(Module):
    """HyReC's learned-lexical side as a sentence-transformers module: the lexicon encoder (eq. 2), the weight
    and union projectors (eq. 4-5), the learned words and the settings. Saved as ``config.json`` (plus
    ``lexicon_layer``: how to build the layers), ``lexical.safetensors``, ``words.json`` and ``SHA256SUMS``
    (checked before anything is read). ``forward`` changes nothing; :meth:`as_encoder` gives the encoder."""

    operates_on_sentence_embedding: bool = True  # leaves the embedding unchanged: a head applied on read
    encoder_tag = "hyrec"  # the retrieval protocol's tag of a model with this branch

    def __init__(self, config: HyReCConfig, lexicon: nn.ModuleList, hidden: int, vocab_size: int,
                 words: WordVocab | None = None, lexicon_layer: dict[str, Any] | None = None):
        super().__init__()
        self.config = config
        self.lexicon = lexicon
        self.weight_proj = WeightProjector(hidden, init_bias=1.0, vocab_size=vocab_size if config.term_bias else None)
        self.union_proj = UnionProjector(hidden, context=config.union_context)
        self.words = words or WordVocab(vocab_size, config.n_word_buckets)
        self.lexicon_layer = lexicon_layer
        #: the domain classifier of ``config.domains`` (fitted after training, :meth:`set_domains`)
        self.domain_classifier: nn.Linear | None = None
        if config.domains:
            self._build_domain_classifier(hidden)

    @property
    def domain_names(self) -> list[str]:
        """The domains of its classifier (empty without): with :meth:`domain_probabilities`, the domain
        classifier protocol of :func:`medadapt.retrieval.late.domain_classifier`."""
        return list(self.config.domains) if self.domain_classifier is not None else []

    def domain_probabilities(self, pooled: Tensor) -> Tensor:
        """The classifier's probabilities (rows, domains) for the frozen ``pooled`` embeddings (rows, hidden)."""
        if self.domain_classifier is None:
            raise ConfigError("this lexical branch has no domain classifier (config.domains is empty)")
        return domain_probabilities(self.domain_classifier, pooled)

    def _build_domain_classifier(self, hidden: int) -> None:
        self.domain_classifier = nn.Linear(hidden, len(self.config.domains)).requires_grad_(False)

    def set_domains(self, domains: Sequence[str], dense_weights: Sequence[float], weight: Tensor, bias: Tensor
                    ) -> None:
        """Install a fusion weight per domain (each > 0) and the fitted classifier (``weight``: (domains,
        hidden) over the normalised frozen pooled embedding, ``bias``: (domains,)); saved with the branch. The
        one ``dense_weight`` becomes 1: the domains' weights take its place."""
        if len(domains) != len(dense_weights) or len(domains) < 2 or not all(w > 0 for w in dense_weights):
            raise ValueError("set_domains needs two or more domains, each with a dense weight > 0")
        self.config = dataclasses.replace(self.config, domains=list(domains), dense_weight=1.0,
                                          domain_dense_weights=[float(w) for w in dense_weights])
        self._build_domain_classifier(int(weight.shape[1]))
        with torch.no_grad():
            self.domain_classifier.weight.copy_(weight)
            self.domain_classifier.bias.copy_(bias)
        self.domain_classifier.to(self.weight_proj.linear.weight.device)

    @classmethod
    def from_tower(cls, transformer, config: HyReCConfig) -> LexicalBranch:
        """A fresh branch on a ``Transformer``: the lexicon encoder copies its dense-encoder layers (GLAE)."""
        auto = transformer.auto_model
        lexicon = split_layers(auto, config.branch_layers, config.lexicon_layers)[2]
        return cls(config, lexicon, auto.config.hidden_size, len(transformer.tokenizer), None, _layer_spec(auto))

    def forward(self, features: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return features

    @property
    def n_terms(self) -> int:
        return self.words.n_terms

    def as_encoder(self, model) -> HyReCModel:
        """``model`` (which holds this branch) as a dense + learned-sparse encoder."""
        return HyReCModel(model)

    # ------------------------------------------------------------------ persistence
    def save(self, output_path: str, *args: Any, **kwargs: Any) -> None:
        folder = Path(output_path)
        folder.mkdir(parents=True, exist_ok=True)
        state = {f"lexicon.{k}": v for k, v in self.lexicon.state_dict().items()}
        state.update({f"weight_proj.{k}": v for k, v in self.weight_proj.state_dict().items()})
        state.update({f"union_proj.{k}": v for k, v in self.union_proj.state_dict().items()})
        if self.domain_classifier is not None:
            state.update({f"domain.{k}": v for k, v in self.domain_classifier.state_dict().items()})
        atomic_save_tensors(folder / "lexical.safetensors", state)
        atomic_write_json(folder / "words.json", self.words.to_json())
        atomic_write_json(folder / "config.json", {**self.config.to_dict(), "lexicon_layer": self.lexicon_layer})
        write_sums(folder, LEXICAL_FILES)  # checked by read before any of them is read

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token: bool | str | None = None,
             cache_folder: str | None = None, revision: str | None = None, local_files_only: bool = False,
             **kwargs: Any) -> Self:
        folder = cls.load_dir_path(model_name_or_path, subfolder=subfolder, token=token,
                                   cache_folder=cache_folder, revision=revision, local_files_only=local_files_only)
        return cls.read(folder)

    @classmethod
    def load_side(cls, folder: str | Path, model) -> Self:
        """The branch kept beside ``model``'s own files (an adapter-only folder, or the old layout's
        ``hyrec/``, whose config has no ``lexicon_layer``: the layers are then copied from the branch tower
        and the saved weights loaded into them)."""
        return cls.read(folder, tower=branch_tower(model))

    @classmethod
    def read(cls, folder: str | Path, tower=None) -> Self:
        """Read a saved branch after its ``SHA256SUMS`` is checked (format 1, saved before the sums: with a
        warning).

        Raises:
            ModelLoadError: no config, sums missing or not matching, an unreadable file, no layer description
                and no ``tower`` to copy the layers from."""
        from safetensors.torch import load_file

        folder = Path(folder)
        raw = _read_config(folder)
        spec = raw.pop("lexicon_layer", None)
        try:
            config = HyReCConfig.from_dict(raw)
            words = WordVocab.from_json(json.loads((folder / "words.json").read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError) as exc:
            raise ModelLoadError(f"HyReC lexical branch {folder}: cannot read its files ({exc})") from None
        state = load_file(str(folder / "lexical.safetensors"))
        if spec is not None:
            lexicon = _build_layers(spec, config.lexicon_layers or config.branch_layers, folder)
        elif tower is not None:  # the old layout: layers copied from the tower, the saved weights loaded below
            spec = _layer_spec(tower.auto_model)
            lexicon = split_layers(tower.auto_model, config.branch_layers, config.lexicon_layers)[2]
        else:
            raise ModelLoadError(f"{folder}: a HyReC lexical side of the old layout loads with its model "
                                 "(medadapt.load of the model folder)")
        hidden = int(state["weight_proj.linear.weight"].shape[1])
        bias = state.get("weight_proj.term_bias.weight")
        branch = cls(config, lexicon, hidden, int(bias.shape[0]) if bias is not None else words.vocab_size, words,
                     spec)
        parts = [("lexicon.", branch.lexicon), ("weight_proj.", branch.weight_proj), ("union_proj.", branch.union_proj)]
        if branch.domain_classifier is not None:
            parts.append(("domain.", branch.domain_classifier))
        for prefix, module in parts:
            part = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            module.load_state_dict(part, strict=True)
        return branch


def _read_config(folder: Path) -> dict[str, Any]:
    """The raw config of a saved branch, after its sums are checked (see :meth:`LexicalBranch.read`)."""
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"{folder}: not a HyReC lexical branch (no config.json)")
    if (folder / SUMS).is_file() or _format_of(folder / "config.json") != 1:
        try:
            verify_sums(folder, cover=LEXICAL_FILES)
        except ChecksumError as exc:
            raise ModelLoadError(f"HyReC model {folder.parent}: {exc}; save or train it again") from None
    else:
        warn(f"HyReC model {folder.parent} was saved before {folder.name}/{SUMS} existed: its lexical files are "
             "not checked; save it again (HyReCModel.save) to add them")
    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"HyReC model {folder.parent}: cannot read {folder.name}/config.json ({exc})") from None
    if not isinstance(raw, dict):
        raise ModelLoadError(f"HyReC model {folder.parent}: {folder.name}/config.json is not an object")
    return raw


def _layer_spec(auto_model) -> dict[str, Any]:
    """How to build the lexicon layers again: the class of the backbone's layers, its configuration and
    attention implementation (the saved ``lexicon_layer``)."""
    layer = encoder_layers(auto_model)[0]
    return {"class": f"{type(layer).__module__}.{type(layer).__qualname__}", "config": auto_model.config.to_dict(),
            "attn_implementation": auto_model.config._attn_implementation}


def _build_layers(spec: dict[str, Any], n: int, folder: Path) -> nn.ModuleList:
    """``n`` fresh lexicon layers from a saved layer description (a class of the installed transformers
    package, its model configuration and attention implementation)."""
    from sentence_transformers.util import import_from_string
    from transformers import AutoConfig

    ref = str(spec.get("class", ""))
    if not ref.startswith("transformers.") or any(p.startswith("_") for p in ref.split(".")):
        raise ModelLoadError(f"{folder}: lexicon layer class {ref!r} is not a transformers layer")
    try:
        layer_cls = import_from_string(ref)
        settings = dict(spec["config"])
        config = AutoConfig.for_model(settings.pop("model_type"), **settings)
        config._attn_implementation = spec.get("attn_implementation") or "eager"
        return nn.ModuleList(layer_cls(config) for _ in range(n))
    except (ImportError, KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{folder}: cannot build the lexicon layers ({exc})") from None


class HyReCModel(nn.Module):
    """HyReC over a sentence-transformers model whose last module is its :class:`LexicalBranch`: the
    training-time and encoding view (see the module docstring). Build one with :meth:`from_backbone`, reload
    with :meth:`load`; ``HyReCModel(st)`` views a loaded model, ``HyReCModel(st, config)`` adds a fresh branch.
    """

    def __init__(self, st_model, config: HyReCConfig | None = None):
        super().__init__()
        self.st = st_model
        if find_branch(st_model) is None:
            if config is None:
                raise ConfigError("this model has no HyReC lexical branch; pass a HyReCConfig to add one")
            branch = LexicalBranch.from_tower(branch_tower(st_model), config)
            st_model.add_module(str(len(st_model._modules)), branch.to(_device_of(st_model)))
        self._n_shared = len(encoder_layers(self.auto_model)) - self.config.branch_layers
        self._excluded_ids = torch.tensor(sorted(set(self.tokenizer.all_special_ids)), dtype=torch.long)
        if self.config.variant == "frozen":
            self.freeze_shared()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_backbone(cls, backbone: str, config: HyReCConfig | None = None, *,
                      extend_with: Sequence[str] = (),
                      device: str | None = None, seed: int = 0, num_layers: int | None = None,
                      scratch: bool = False) -> HyReCModel:
        """A fresh HyReC model on ``backbone`` (alias, folder or hub id; its first module must be a
        ``Transformer``). ``extend_with``: texts whose CJK characters unknown to the tokenizer are added as
        new tokens (new embedding rows drawn with ``seed``, scaled like the existing ones). ``scratch``:
        keep the backbone's architecture and tokenizer only, its weights drawn anew with ``seed`` (the
        model's own initialisation), for RetroMAE pre-training from scratch as the paper does."""
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.base.modules import Normalize, Transformer
        from sentence_transformers.sentence_transformer.modules import Pooling

        config = config or HyReCConfig()
        base = load(backbone, device="cpu")
        transformer = base[0]
        if not isinstance(transformer, Transformer):
            raise ConfigError(f"{backbone}: the first module must be a Transformer, "
                              f"got {type(transformer).__name__}")
        transformer.max_seq_length = config.dense_max_length or config.passage_max_length
        if num_layers is not None:
            truncate_layers(transformer.auto_model, num_layers)
        if scratch:
            auto = transformer.auto_model
            with torch.random.fork_rng(devices=[]):  # a model built from the config draws every weight
                torch.manual_seed(seed)
                fresh = type(auto)(auto.config)
            auto.load_state_dict(fresh.state_dict())
        if extend_with:
            extend_vocabulary(transformer, cjk_characters(extend_with), seed=seed)
        dim = transformer.get_embedding_dimension()
        pooling = Pooling(dim, pooling_mode=config.pooling)
        st = SentenceTransformer(modules=[transformer, pooling, DenseProjector(dim), Normalize()],
                                 device="cpu", prompts=dict(base.prompts or {}))
        model = cls(st, config)
        return model.to(device) if device else model

    @classmethod
    def load(cls, folder: str | Path, device: str | None = None) -> HyReCModel:
        """A saved HyReC or composed folder (either layout: :func:`medadapt.load` appends an old ``hyrec/``).

        Raises:
            ModelLoadError: the folder does not load, or its model has no lexical branch."""
        st = load(str(folder), device=device or "cpu")
        if find_branch(st) is None:
            raise ModelLoadError(f"{folder}: not a HyReC model (no learned-lexical branch)")
        return cls(st)

    # ------------------------------------------------------------------ parts
    @property
    def branch(self) -> LexicalBranch:
        return find_branch(self.st)

    @property
    def config(self) -> HyReCConfig:
        return self.branch.config

    @property
    def lexicon(self) -> nn.ModuleList:
        return self.branch.lexicon

    @property
    def weight_proj(self) -> WeightProjector:
        return self.branch.weight_proj

    @property
    def union_proj(self) -> UnionProjector:
        return self.branch.union_proj

    @property
    def words(self) -> WordVocab:
        return self.branch.words

    @property
    def asymmetric(self) -> bool:
        """``True`` when the dense side is an asymmetric (``Router``) model (module docstring)."""
        return _document_route(self.st) is not None

    @property
    def transformer(self):
        """The ``Transformer`` the lexical branch reads (:func:`branch_tower`)."""
        return branch_tower(self.st)

    @property
    def auto_model(self) -> nn.Module:
        return self.transformer.auto_model

    @property
    def tokenizer(self):
        return self.transformer.tokenizer

    @property
    def projector(self) -> nn.Module:
        """The dense head between pooling and ``Normalize``: a :class:`DenseProjector` (eq. 6) or, in a
        composed model, medadapt heads (an :class:`~medadapt.adapters.stack.AdapterStack`, e.g. a MoE head);
        an empty ``nn.Sequential`` (identity) when there is none. For an asymmetric dense side: the query
        route's modules (the dense side's own, which a branch keeps as trained)."""
        from sentence_transformers.base.modules import Normalize

        if self.asymmetric:
            return nn.Sequential(*next(iter(self.st._modules.values())).sub_modules["query"])
        mods = [m for m in dense_modules(self.st)[2:] if not isinstance(m, Normalize)]
        return mods[0] if len(mods) == 1 else nn.Sequential(*mods)

    @property
    def shared_layers(self) -> list[nn.Module]:
        return list(encoder_layers(self.auto_model)[: self._n_shared])

    @property
    def dense_layers(self) -> list[nn.Module]:
        return list(encoder_layers(self.auto_model)[self._n_shared :])

    @property
    def n_terms(self) -> int:
        """Size of the term space (tokenizer ids + learned-word buckets): the inverted index's ``n_terms``."""
        return self.words.n_terms

    @property
    def vocab_size(self) -> int:
        return self.words.vocab_size

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def shared_parameters(self) -> list[nn.Parameter]:
        params = list(self.auto_model.embeddings.parameters())
        for layer in self.shared_layers:
            params += list(layer.parameters())
        return params

    def freeze_shared(self) -> None:
        for p in self.shared_parameters():
            p.requires_grad_(False)

    def shared_fingerprint(self) -> str:
        """Identity of the frozen sharing backbone and tokenizer (keys the shared-state cache)."""
        mods = [self.auto_model.embeddings, *self.shared_layers]
        tok = tokenizer_fingerprint(self.tokenizer)  # vocabulary (added tokens too) and what it does to text
        return hashlib.sha256(f"{modules_fingerprint(mods)}|{tok}".encode()).hexdigest()[:24]

    # ------------------------------------------------------------------ tokenising
    def tokenize(self, texts: Sequence[str], role: Role, offsets: bool = False) -> dict[str, Tensor]:
        max_len = self.config.query_max_length if role == "query" else self.config.passage_max_length
        enc = self.tokenizer(list(texts), padding=True, truncation=True, max_length=max_len,
                             return_tensors="pt", return_offsets_mapping=offsets)
        return dict(enc)

    def term_mask(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """1 where a token may be a term: not padding, not special, not unknown."""
        excluded = torch.isin(input_ids, self._excluded_ids.to(input_ids.device))
        return attention_mask.bool() & ~excluded

    # ------------------------------------------------------------------ forward
    def shared_states(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None
                      ) -> Tensor:
        """``S^(x)`` (eq. 1): embeddings and the first ``L - N`` layers."""
        hidden = embed(self.auto_model, input_ids, token_type_ids)
        return run_layers(self.shared_layers, hidden, extended_mask(attention_mask, hidden.dtype))

    def lexicon_states(self, states: Tensor, attention_mask: Tensor) -> Tensor:
        """``L^(x)`` (eq. 2): the lexicon encoder over shared states."""
        return run_layers(self.lexicon, states, extended_mask(attention_mask, states.dtype))

    def heads_from_lexicon(self, lex: Tensor, input_ids: Tensor, attention_mask: Tensor | None = None
                           ) -> tuple[Tensor, Tensor]:
        """``(term_weights, union_logits)`` from lexicon states (eq. 4, 5)."""
        return self.weight_proj(lex, input_ids), self.union_proj(lex, attention_mask)

    def lexical_from_states(self, states: Tensor, attention_mask: Tensor, input_ids: Tensor
                            ) -> tuple[Tensor, Tensor]:
        """``(term_weights (B, T), union_logits (B, T, 4))`` from shared states (eq. 2, 4, 5)."""
        return self.heads_from_lexicon(self.lexicon_states(states, attention_mask), input_ids, attention_mask)

    def pooled_from_states(self, states: Tensor, attention_mask: Tensor) -> Tensor:
        """Dense encoder (eq. 3) + pooling, before the projector."""
        d = run_layers(self.dense_layers, states, extended_mask(attention_mask, states.dtype))
        if self.config.pooling == "cls":
            return d[:, 0]
        m = attention_mask.unsqueeze(-1).to(d.dtype)
        return (d * m).sum(1) / m.sum(1).clamp_min(1e-9)

    def dense_from_pooled(self, pooled: Tensor) -> Tensor:
        """Dense projector (eq. 6) or the composed dense head; not normalised."""
        if self.asymmetric:
            raise ConfigError("an asymmetric dense side has no pooled-state path (its queries go through the "
                              "query tower): encode dense vectors with encode_dense, and keep the branch's "
                              "loss.dense_weight at 0")
        head = self.projector
        if isinstance(head, DenseProjector):
            return head.linear(pooled)
        features = {"sentence_embedding": pooled}
        for module in (head if isinstance(head, nn.Sequential) else [head]):
            features = module(features)
        return features["sentence_embedding"]

    def forward(self, features: dict[str, Tensor], states: Tensor | None = None, with_dense: bool = True
                ) -> dict[str, Tensor]:
        """All three outputs for tokenised texts; pass precomputed ``states`` to skip the sharing backbone."""
        ids, mask = features["input_ids"], features["attention_mask"]
        if states is None:
            if self.config.variant == "frozen":
                with torch.no_grad():
                    states = self.shared_states(ids, mask, features.get("token_type_ids"))
            else:
                states = self.shared_states(ids, mask, features.get("token_type_ids"))
        weights, union = self.lexical_from_states(states, mask, ids)
        tmask = self.term_mask(ids, mask)
        dense = self.dense_from_pooled(self.pooled_from_states(states, mask)) if with_dense else None
        return {"dense": dense, "term_weights": weights * tmask.to(weights.dtype), "union_logits": union,
                "term_mask": tmask, "input_ids": ids}

    def term_vectors(self, term_weights: Tensor, input_ids: Tensor) -> Tensor:
        """Scatter-max token weights into ``(B, vocab_size)`` vectors over tokenizer terms (no words)."""
        out = term_weights.new_zeros(term_weights.shape[0], self.vocab_size)
        return out.scatter_reduce(1, input_ids, term_weights, reduce="amax", include_self=True)

    def bagged_terms(self, term_weights: Tensor, input_ids: Tensor, term_mask: Tensor,
                     labels: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(weights, term_ids)``, both ``(B, T + S)``: every token of each text and, given BMES ``labels``
        ``(B, T)``, every multi-token word, with ``W_word = max`` over its tokens (eq. 8, differentiable) and
        its stable word id. This is eq. 10's term set (tokens and words) at training time, bagged exactly
        as :meth:`encode` bags at inference (over the valid terms in order, ``keep_subterms`` honoured);
        non-terms and empty word slots have weight 0."""
        if labels is None:
            return term_weights, input_ids
        B, T = input_ids.shape
        keep_rows = [row.nonzero().squeeze(1).tolist() for row in term_mask.cpu()]
        lab_rows, ids_rows = labels.cpu().tolist(), input_ids.cpu().tolist()
        slot_rows: list[list[int]] = []
        word_ids: list[list[int]] = []
        for keep, lab_r, ids_r in zip(keep_rows, lab_rows, ids_rows):
            row_slot = [-1] * T
            wids: list[int] = []
            for group in group_words([S if lab_r[k] == IGNORE else lab_r[k] for k in keep]):
                if len(group) < 2:
                    continue
                pos = [keep[g] for g in group]
                for q in pos:
                    row_slot[q] = len(wids)
                wids.append(self.words.word_id([ids_r[q] for q in pos]))
            slot_rows.append(row_slot)
            word_ids.append(wids)
        slot = torch.tensor(slot_rows, dtype=torch.long).reshape(B, T)
        n_slots = max((len(w) for w in word_ids), default=0)
        if n_slots == 0:
            return term_weights, input_ids
        dev = term_weights.device
        slot = slot.to(dev)
        index = torch.where(slot >= 0, slot, torch.full_like(slot, n_slots))  # non-word tokens: a spare slot
        word_w = term_weights.new_zeros(B, n_slots + 1).scatter_reduce(
            1, index, term_weights, reduce="amax", include_self=True)[:, :n_slots]
        wid = torch.tensor([w + [0] * (n_slots - len(w)) for w in word_ids], dtype=input_ids.dtype)
        tok_w = term_weights if self.config.keep_subterms else term_weights * (slot < 0).to(term_weights.dtype)
        return torch.cat([tok_w, word_w], 1), torch.cat([input_ids, wid.to(input_ids.device)], 1)

    @staticmethod
    def compact_term_vectors(*terms: tuple[Tensor, Tensor]) -> list[Tensor]:
        """Scatter-max ``(weights, term_ids)`` pairs (see :meth:`bagged_terms`) into dense vectors over the
        terms that occur in any of them (one shared compact term space, so dot products between the
        outputs equal the sparse dot products over all ``n_terms`` term ids)."""
        all_ids = torch.cat([ids.reshape(-1) for _, ids in terms])
        uniq, inverse = torch.unique(all_ids, return_inverse=True)
        out, start = [], 0
        for w, ids in terms:
            n = ids.numel()
            idx = inverse[start : start + n].reshape(ids.shape)
            start += n
            vec = w.new_zeros(w.shape[0], len(uniq))
            out.append(vec.scatter_reduce(1, idx, w, reduce="amax", include_self=True))
        return out

    # ------------------------------------------------------------------ inference
    @torch.no_grad()
    def encode(self, texts: Sequence[str], role: Role = "document", *, lexical: bool = True,
               dense: bool = True,
               batch_size: int = 32, state_cache=None, show_progress: bool = False, desc: str | None = None,
               cached_pooled: bool = False, cached_lexicon: bool = False
               ) -> tuple[np.ndarray | None, list[dict[int, float]] | None]:
        """``(dense (n, D) normalised or None, lexical list of normalised {term_id: weight} or None)``.

        With ``state_cache`` (a :class:`~medadapt.hyrec.data.SharedStateCache`, frozen variant only) the
        sharing backbone's token states are read from / written to the cache; ``cached_pooled`` also takes
        the pooled dense-encoder outputs from it (valid only while the dense encoder is frozen) and
        ``cached_lexicon`` the lexicon encoder's states (valid only while the lexicon encoder is frozen).
        """
        was = self.training
        self.eval()
        texts = list(texts)
        dense_out: list[np.ndarray] = []
        lex_out: list[dict[int, float]] = []
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        route_dense = dense and self.asymmetric  # cached_pooled does not apply: see the module docstring
        if route_dense:
            from sentence_transformers.base.modules import Normalize

            route_normalized = isinstance(dense_modules(self.st)[-1], Normalize)
        pin = contextlib.ExitStack()
        if state_cache is not None:  # weights are fixed for the pass: check the cache's fingerprints once
            pin.enter_context(state_cache.pinned(self))
        try:
            what = "queries" if role == "query" else "documents"
            for start in progress(range(0, len(texts), batch_size), desc=desc or f"encoding {what}", unit="batch",
                              disable=not show_progress):
                idx = order[start : start + batch_size]
                batch = [texts[i] for i in idx]
                if route_dense:  # the routes themselves: the query tower / the unchanged document tower
                    fn = self.st.encode_query if role == "query" else self.st.encode_document
                    d = fn(batch, batch_size=len(batch), convert_to_tensor=True, show_progress_bar=False).float()
                    if not route_normalized:  # an ending Normalize already did (and again could change bits)
                        d = torch.nn.functional.normalize(d, dim=-1)
                    dense_out.append(d.cpu().numpy())
                    if not lexical:
                        continue
                if state_cache is not None and cached_lexicon and (cached_pooled or not dense or route_dense):
                    ids, mask, states = state_cache.lexicon_batch(self, batch, role)  # states unused below
                    ids, mask = ids.to(self.device), mask.to(self.device)
                elif state_cache is not None:
                    ids, mask, states = state_cache.batch(self, batch, role)
                    ids, mask, states = ids.to(self.device), mask.to(self.device), states.to(self.device)
                else:
                    feats = {k: v.to(self.device) for k, v in self.tokenize(batch, role).items()}
                    ids, mask = feats["input_ids"], feats["attention_mask"]
                    states = self.shared_states(ids, mask, feats.get("token_type_ids"))
                states = states.float()
                if dense and not route_dense:
                    pooled = (state_cache.pooled(self, batch, role) .to(self.device) if cached_pooled and
                              state_cache is not None else self.pooled_from_states(states, mask))
                    d = self.dense_from_pooled(pooled)
                    dense_out.append(torch.nn.functional.normalize(d, dim=-1).cpu().numpy())
                if lexical:
                    if cached_lexicon and state_cache is not None:
                        _, _, lex = state_cache.lexicon_batch(self, batch, role)
                        weights, union = self.heads_from_lexicon(lex.to(self.device), ids, mask)
                    else:
                        weights, union = self.lexical_from_states(states, mask, ids)
                    labels = None
                    if self.config.union_source == "labels":
                        labels = self._label_cache().labels(batch, role, ids.shape[1])
                    vectors = self._sparse(ids, mask, weights, union, labels)
                    if role == "query" and self.branch.domain_classifier is not None:
                        if not (dense and not route_dense):
                            pooled = (state_cache.pooled(self, batch, role).to(self.device) if state_cache
                                      is not None else self.pooled_from_states(states, mask))
                        scales = self.lexical_query_scale(pooled).tolist()
                        vectors = [{t: w * c for t, w in v.items()} for v, c in zip(vectors, scales)]
                    lex_out.extend(vectors)
        finally:
            pin.close()
            self.train(was)
        inv = np.argsort(np.asarray(order, dtype=np.int64)) if texts else np.zeros(0, dtype=np.int64)
        d_arr = np.concatenate(dense_out)[inv] if dense and dense_out else None
        if dense and not texts:
            d_arr = np.zeros((0, self.embedding_dim), dtype=np.float32)
        lex = [lex_out[i] for i in inv] if lexical else None
        return d_arr, lex

    def lexical_query_scale(self, pooled: Tensor) -> Tensor:
        """Per query (rows of the frozen ``pooled`` embedding) the factor on its lexical vector that turns the
        one ``dense_weight`` W of the sum fusion into its domain's: ``W * sum_k p_k / w_k`` (``p``: the domain
        classifier's probabilities, ``w_k``: ``config.domain_dense_weights``), so ``c * lexical + W * dense``
        ranks as ``lexical + w_k * dense`` for a query of domain k. Ones without domains."""
        cfg, clf = self.config, self.branch.domain_classifier
        if clf is None:
            return torch.ones(pooled.shape[0])
        inverse = 1.0 / torch.tensor(cfg.domain_dense_weights)
        with torch.no_grad():
            return cfg.dense_weight * domain_mix(clf, pooled.float(), inverse).cpu()

    def _label_cache(self):
        if getattr(self, "_labels", None) is None:
            self._labels = UnionLabelCache(self, self.config.language)
        return self._labels

    def _sparse(self, ids: Tensor, mask: Tensor, weights: Tensor, union: Tensor | None,
                labels: Tensor | None = None) -> list[dict[int, float]]:
        tmask = self.term_mask(ids, mask).cpu().numpy()
        ids_np, w_np = ids.cpu().numpy(), weights.float().cpu().numpy()
        if labels is not None:  # segmentation from the labelling tool: one-hot "probabilities"
            lab = labels.clone()
            lab[lab == IGNORE] = S
            probs = torch.nn.functional.one_hot(lab, 4).float().numpy()
        elif self.config.union and union is not None:
            probs = torch.softmax(union.float(), dim=-1).cpu().numpy()
        else:
            probs = None
        out = []
        for r in range(ids_np.shape[0]):
            keep = tmask[r]
            # bag over the valid tokens in order (special / unknown tokens are dropped first)
            p_row = probs[r][keep] if probs is not None else None
            vec = sparse_from_tokens(ids_np[r][keep], w_np[r][keep], p_row, self.words,
                                     keep_subterms=self.config.keep_subterms,
                                     min_union=self.config.min_union, word_text=self._word_text)
            out.append(normalize_sparse(vec))
        return out

    def _word_text(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids)).replace(" ", "") if self.config.language == "zh" \
            else self.tokenizer.decode(list(token_ids))

    def encode_dense(self, texts: Sequence[str], role: Role = "document", **kwargs) -> np.ndarray:
        return self.encode(texts, role, lexical=False, dense=True, **kwargs)[0]

    def encode_lexical(self, texts: Sequence[str], role: Role = "document", **kwargs
                       ) -> list[dict[int, float]]:
        return self.encode(texts, role, lexical=True, dense=False, **kwargs)[1]

    # ------------------------------------------------------------------ retrieval encoder protocol
    #: :mod:`medadapt.retrieval.encoders`: a HyReC model is a dense + learned-sparse (hybrid) encoder.
    encoder_tag = LexicalBranch.encoder_tag
    similarity_fn_name = "cosine"  # encode_dense returns L2-normalised vectors

    @property
    def embedding_dim(self) -> int:
        """Dimension of the dense vectors."""
        return int(self.st.get_embedding_dimension())

    @property
    def fusion_defaults(self) -> dict[str, Any]:
        """The hybrid fusion this model was trained (and, with ``eval.tune_dense_weight``, tuned) for: its NM
        sum (eq. 9) at its ``dense_weight``. ``Retriever.build`` without a config and ``medadapt index``
        without ``--fusion`` / ``--dense-weight`` use it."""
        return {"method": "sum", "dense_weight": float(self.config.dense_weight)}

    def encoder_identity(self) -> dict[str, Any]:
        """What a retrieval index records to recognise this model: a fingerprint over the dense side, the
        lexicon encoder, the projectors and the configuration (the same value as before the branch was a
        module, so indexes built then still open)."""
        dense = copy.copy(self.st)  # the dense side alone, sharing the modules
        dense.__dict__["_modules"] = OrderedDict((k, m) for k, m in self.st._modules.items()
                                                 if not isinstance(m, LexicalBranch))
        parts = [dense, self.lexicon, self.weight_proj, self.union_proj]
        if self.branch.domain_classifier is not None:
            parts.append(self.branch.domain_classifier)
        ident = modules_fingerprint(parts) + \
            json.dumps(self.config.to_dict(), sort_keys=True)
        return {"fingerprint": hashlib.sha256(ident.encode()).hexdigest()[:32], "similarity": "cosine",
                "max_seq_length": self.config.passage_max_length}

    def encode_query(self, texts: Sequence[str], *, batch_size: int = 32, show_progress: bool = False
                     ) -> np.ndarray:
        """Normalised dense query vectors (:meth:`encode_dense` with role ``"query"``)."""
        return self.encode_dense(texts, "query", batch_size=batch_size, show_progress=show_progress)

    def encode_document(self, texts: Sequence[str], *, batch_size: int = 32, show_progress: bool = False
                        ) -> np.ndarray:
        """Normalised dense document vectors (:meth:`encode_dense` with role ``"document"``)."""
        return self.encode_dense(texts, "document", batch_size=batch_size, show_progress=show_progress)

    def decode(self, vector: dict[int, float], top: int | None = None) -> list[tuple[str, float]]:
        """Human-readable ``(term, weight)`` pairs of a sparse vector, heaviest first."""
        items = sorted(vector.items(), key=lambda kv: -kv[1])[:top]
        tok = self.tokenizer
        return [(self.words.decode(t, lambda i: tok.convert_ids_to_tokens(i)).strip(), w) for t, w in items]

    # ------------------------------------------------------------------ persistence
    def save(self, folder: str | Path) -> None:
        """Write the sentence-transformers folder; the lexical branch is one of its modules."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.st.save(str(folder))  # `medadapt train` saves into a fresh folder swapped in as a whole

    def save_adapter(self, folder: str | Path, *, base: str | None = None, name: str | None = None) -> None:
        """Adapter-only save of a composed model on an unchanged backbone: the dense heads as an adapter folder
        tied to ``base`` (:mod:`medadapt.adapters.files`), the branch in ``hyrec/`` named in
        ``side_modules.json``; :func:`medadapt.load` puts both back on the base. Swapped in as a whole under
        :func:`medadapt.io.check_output` (``folder`` new, empty or an adapter folder).

        Raises:
            ConfigError: ``folder`` cannot take an adapter folder; nothing is changed."""
        folder = Path(folder)
        branch = self.branch
        with replace_folder(folder, ADAPTER_FOLDER, what="adapter folder") as tmp:
            with _without_branch(self.st):  # the base's fingerprint covers the backbone only
                write_adapter(self.st, tmp, base=base, name=name or folder.name, allow_empty=True)
            branch.save(str(tmp / SUBDIR))
            ref = f"{type(branch).__module__}.{type(branch).__qualname__}"
            atomic_write_json(tmp / SIDE_MODULES, [{"path": SUBDIR, "type": ref}])


@contextlib.contextmanager
def _without_branch(st_model) -> Iterator[None]:
    """``st_model`` without its last module, the lexical branch, inside the block."""
    key, branch = next(reversed(st_model._modules.items()))
    assert isinstance(branch, LexicalBranch)
    del st_model._modules[key]
    try:
        yield
    finally:
        st_model._modules[key] = branch


def _device_of(st_model) -> torch.device:
    return next(iter(st_model.parameters())).device


def _format_of(path: Path) -> int | None:
    """``format_version`` of a JSON config (``None`` when unreadable: the sums check then names the problem)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data.get("format_version") if isinstance(data, dict) else None


def _document_route(st_model) -> list | None:
    """The document route's modules when ``st_model`` starts with a ``Router`` that has query and document
    routes, else ``None``."""
    if base_kind(st_model) != "asymmetric":
        return None
    return list(next(iter(st_model._modules.values())).sub_modules["document"])


def extend_vocabulary(transformer, characters: Sequence[str], seed: int = 0) -> int:
    """Add ``characters`` the tokenizer maps to the unknown token as new tokens and grow the embedding
    matrix; new rows are drawn from N(mean, std) of the existing rows with ``seed`` (deterministic, so two
    runs on the same texts build the same model). Returns the number of tokens added."""
    tok = transformer.tokenizer
    unk = tok.unk_token_id
    new = [c for c in characters
           if tok.convert_tokens_to_ids(c) == unk and tok.tokenize(c) in ([tok.unk_token], [])]
    if not new:
        return 0
    before = len(tok)
    tok.add_tokens(new)
    auto = transformer.auto_model
    emb = auto.get_input_embeddings()
    old = emb.weight.data[:before]
    auto.resize_token_embeddings(len(tok), mean_resizing=False)
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(len(tok) - before, old.shape[1], generator=g) * old.std(0) + old.mean(0)
    with torch.no_grad():
        auto.get_input_embeddings().weight[before:] = rows.to(old.dtype)
    return len(tok) - before


