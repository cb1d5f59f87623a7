"""The HyReC model: GLAE + weight / union / dense projectors + bagging (§3.1).

``forward`` maps tokenised texts to ``{"dense": (B, D), "term_weights": (B, T), "union_logits": (B, T, 4),
"term_mask": (B, T), "input_ids": (B, T)}``. :meth:`HyReCModel.encode_dense` returns normalised dense
vectors; :meth:`HyReCModel.encode_lexical` returns one ``{term_id: weight}`` per text (tokenizer terms plus
bagged words, L2-normalised: the Normalisation Module), ready for
:meth:`medadapt.retrieval.LexicalIndex.from_sparse` with ``n_terms = model.n_terms``.

Saved folder = a sentence-transformers model (the dense side: ``Transformer`` -> ``Pooling`` ->
:class:`~medadapt.hyrec.projectors.DenseProjector` -> ``Normalize``; ``medadapt.load(folder)`` gives the
dense retriever alone) plus ``hyrec/``: ``config.json``, ``lexical.safetensors`` (lexicon encoder, weight and
union projectors) and ``words.json`` (strings of learned words). :meth:`HyReCModel.load` restores both sides
exactly.

Term mask: padding, special tokens ([CLS], [SEP], ...) and the unknown token never become terms.

**Asymmetric dense side** (a composed CARE model, :mod:`medadapt.hyrec.branch`): ``st`` may be an
asymmetric ``SentenceTransformer`` (first module a ``Router`` with ``query`` and ``document`` routes). The
lexical branch then reads the *document* route's ``Transformer`` (its tokenizer and first layers) for queries
and documents alike, while dense vectors come from the routes themselves (``st.encode_query`` /
``st.encode_document``: the query tower for queries, the unchanged document tower for documents), so the
document tower's cached embeddings and any dense document index stay valid.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from medadapt.adapters.compose import base_kind
from medadapt.adapters.files import ADAPTER_FOLDER, write_adapter
from medadapt.checksums import SUMS, ChecksumError, verify_sums, write_sums
from medadapt.errors import ConfigError, ModelLoadError, warn
from medadapt.hyrec.bagging import WordVocab, group_words, sparse_from_tokens
from medadapt.hyrec.data import UnionLabelCache
from medadapt.hyrec.glae import (embed, encoder_layers, extended_mask, run_layers, split_layers,
                                 truncate_layers)
from medadapt.hyrec.labels import IGNORE, S
from medadapt.hyrec.normalize import normalize_sparse
from medadapt.hyrec.projectors import DenseProjector, UnionProjector, WeightProjector
from medadapt.identity import modules_fingerprint, tokenizer_fingerprint
from medadapt.io import atomic_save_tensors, atomic_write_json, replace_folder
from medadapt.models import load, model_fingerprint
from medadapt.progress import progress
from medadapt.retrieval.encoders import EncoderKind, register_encoder
from medadapt.retrieval.tokenize import cjk_characters  # noqa: F401  (the one CJK pattern; used below)

__all__ = ["HyReCConfig", "HyReCModel", "HYREC_FORMAT"]

#: 2: ``hyrec/SHA256SUMS`` covers the lexical files (a folder of format 1, written before it, loads with a
#: warning; the config is the same).
HYREC_FORMAT = 2
SUBDIR = "hyrec"
#: The lexical side's files in ``hyrec/``, covered by ``hyrec/SHA256SUMS``.
LEXICAL_FILES = ("lexical.safetensors", "words.json", "config.json")
Role = Literal["query", "document"]


@dataclass
class HyReCConfig:
    """Architecture and inference settings.

    Attributes:
        branch_layers: ``N``, layers of the lexicon encoder and of the dense encoder.
        variant: ``full`` (all trains) or ``frozen`` (sharing backbone frozen).
        pooling: dense pooling, ``cls`` (the paper, eq. 6) or ``mean`` (what MiniLM was trained with).
        union: predict the semantic union and bag words at inference.
        n_word_buckets: size of the learned-word id range above the tokenizer vocabulary.
        keep_subterms: a bagged word also keeps its tokens as terms.
        min_union: union probability (eq. 7) a word needs to be emitted.
        query_max_length / passage_max_length: token limits (paper: 64 / 256).
        dense_weight: ``S = S_lex + dense_weight * S_den`` (eq. 9; 1 in the paper).
        language: union labelling language, ``zh`` or ``en``.
        dense_max_length: token limit of the saved sentence-transformers (dense) side when it encodes on its
            own (``encode_dense`` through the EmbeddingCache); default ``passage_max_length``.
        lexicon_layers: layers of the lexicon encoder, copied from the first dense-encoder layers (default
            ``branch_layers``, the paper's symmetric GLAE).
        term_bias: add a learned per-term bias inside the weight projector (a learned IDF-like prior; not in
            the paper, off by default; useful when the backbone's token embeddings are frozen and new).
        union_source: what bags tokens into words at inference: ``learned`` (the union head, eq. 7-8) or
            ``labels`` (the labelling tool's jieba + regex segmentation, the paper's "Jieba" row of Table 3;
            works without a union head too, so a model trained without the union can be bagged by jieba).
        union_context: ``0`` = the paper's linear union projector (eq. 4); ``k > 0`` = a small MLP over a
            window of ``2k + 1`` lexicon states (not in the paper; for a frozen lexicon encoder, which cannot
            learn the word-boundary features itself).
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

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "format_version": HYREC_FORMAT}

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


class HyReCModel(nn.Module):
    """HyReC over a sentence-transformers model (see the module docstring).

    Build one with :meth:`from_backbone`, reload with :meth:`load`.
    """

    def __init__(self, st_model, config: HyReCConfig, lexicon: nn.ModuleList | None = None,
                 words: WordVocab | None = None):
        super().__init__()
        self.st = st_model
        self.config = config
        auto = self.auto_model
        shared, dense, lex = split_layers(auto, config.branch_layers, config.lexicon_layers)
        self._n_shared = len(shared)
        self.lexicon = lexicon if lexicon is not None else lex
        hidden = auto.config.hidden_size
        self.weight_proj = WeightProjector(hidden, init_bias=1.0,
                                           vocab_size=len(self.tokenizer) if config.term_bias else None)
        self.union_proj = UnionProjector(hidden, context=config.union_context)
        self.words = words or WordVocab(len(self.tokenizer), config.n_word_buckets)
        self._excluded_ids = torch.tensor(sorted(set(self.tokenizer.all_special_ids)), dtype=torch.long)
        if config.variant == "frozen":
            self.freeze_shared()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_backbone(cls, backbone: str, config: HyReCConfig | None = None, *,
                      extend_with: Sequence[str] = (),
                      device: str | None = None, seed: int = 0, num_layers: int | None = None) -> HyReCModel:
        """A fresh HyReC model on ``backbone`` (alias, folder or hub id; its first module must be a
        ``Transformer``). ``extend_with``: texts whose CJK characters unknown to the tokenizer are added as
        new tokens (new embedding rows drawn with ``seed``, scaled like the existing ones)."""
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
        if extend_with:
            extend_vocabulary(transformer, cjk_characters(extend_with), seed=seed)
        dim = transformer.get_embedding_dimension()
        pooling = Pooling(dim, pooling_mode=config.pooling)
        st = SentenceTransformer(modules=[transformer, pooling, DenseProjector(dim), Normalize()],
                                 device="cpu", prompts=dict(base.prompts or {}))
        model = cls(st, config)
        return model.to(device) if device else model

    # ------------------------------------------------------------------ parts
    @property
    def asymmetric(self) -> bool:
        """``True`` when the dense side is an asymmetric (``Router``) model (module docstring)."""
        return _document_route(self.st) is not None

    @property
    def transformer(self):
        """The ``Transformer`` the lexical branch reads: the model's first module, or for an asymmetric dense
        side the document route's first module."""
        route = _document_route(self.st)
        return route[0] if route is not None else self.st[0]

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
        mods = [m for m in list(self.st._modules.values())[2:] if not isinstance(m, Normalize)]
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
        import hashlib

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

            route_normalized = isinstance(list(self.st._modules.values())[-1], Normalize)
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
                    lex_out.extend(self._sparse(ids, mask, weights, union, labels))
        finally:
            self.train(was)
        inv = np.argsort(np.asarray(order, dtype=np.int64)) if texts else np.zeros(0, dtype=np.int64)
        d_arr = np.concatenate(dense_out)[inv] if dense and dense_out else None
        if dense and not texts:
            d_arr = np.zeros((0, self.embedding_dim), dtype=np.float32)
        lex = [lex_out[i] for i in inv] if lexical else None
        return d_arr, lex

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
    encoder_tag = "hyrec"
    similarity_fn_name = "cosine"  # encode_dense returns L2-normalised vectors

    @property
    def embedding_dim(self) -> int:
        """Dimension of the dense vectors."""
        return int(self.st.get_embedding_dimension())

    @property
    def fusion_defaults(self) -> dict[str, Any]:
        """The hybrid fusion this model was trained (and, with ``eval.tune_dense_weight``, tuned) for: its NM
        sum (eq. 9) at its ``dense_weight``. ``Retriever.build`` without a config and ``medadapt index``
        without ``--fusion`` / ``--dense-weight`` use it (:class:`~medadapt.retrieval.encoders.Encoder`)."""
        return {"method": "sum", "dense_weight": float(self.config.dense_weight)}

    def encoder_identity(self) -> dict[str, Any]:
        """What a retrieval index records to recognise this model: a fingerprint over every module (dense
        side, lexicon encoder, projectors) and the configuration (bagging settings, lengths)."""
        import hashlib

        ident = model_fingerprint(self) + json.dumps(self.config.to_dict(), sort_keys=True)
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
        """Write the sentence-transformers folder (dense side) and ``hyrec/`` (lexical side)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.st.save(str(folder))  # `medadapt train` saves into a fresh folder swapped in as a whole
        self._save_lexical(folder)

    def save_adapter(self, folder: str | Path, *, base: str | None = None, name: str | None = None) -> None:
        """Adapter-only save of a model whose backbone is unchanged (a composed model: frozen base + medadapt
        dense heads + this lexical branch): the dense heads as an adapter folder tied to ``base``
        (:mod:`medadapt.adapters.files`) plus ``hyrec/``. :meth:`load` (and ``medadapt.load`` for the dense
        side) loads the base model and puts both back.

        Written to a temporary sibling and swapped in as a whole, under the output policy of
        :func:`medadapt.io.check_output`: ``folder`` may be new, empty or an adapter folder (replaced); a
        symlink is written through.

        Raises:
            ConfigError: ``folder`` is a file, a non-empty folder that is not an adapter, the current folder
                or one above it, or cannot be written; nothing is changed."""
        folder = Path(folder)
        with replace_folder(folder, ADAPTER_FOLDER, what="adapter folder") as tmp:
            write_adapter(self.st, tmp, base=base, name=name or folder.name, allow_empty=True)
            self._save_lexical(tmp)

    def _save_lexical(self, folder: Path) -> None:
        sub = folder / SUBDIR
        sub.mkdir(parents=True, exist_ok=True)
        state = {f"lexicon.{k}": v for k, v in self.lexicon.state_dict().items()}
        state.update({f"weight_proj.{k}": v for k, v in self.weight_proj.state_dict().items()})
        state.update({f"union_proj.{k}": v for k, v in self.union_proj.state_dict().items()})
        atomic_save_tensors(sub / "lexical.safetensors", state)
        atomic_write_json(sub / "words.json", self.words.to_json())
        atomic_write_json(sub / "config.json", self.config.to_dict())
        write_sums(sub, LEXICAL_FILES)  # checked by load before any of them is read

    @staticmethod
    def read_config(folder: str | Path) -> HyReCConfig:
        """The :class:`HyReCConfig` of a saved folder, after ``hyrec/SHA256SUMS`` is checked (a folder of
        format 1, saved before the sums and holding none, is read with a warning).

        Raises:
            ModelLoadError: not a HyReC folder, sums missing or not matching, an unreadable config."""
        folder = Path(folder)
        sub = folder / SUBDIR
        if not (sub / "config.json").is_file():
            raise ModelLoadError(f"{folder}: not a HyReC model (no {SUBDIR}/config.json)")
        if (sub / SUMS).is_file() or _format_of(sub / "config.json") != 1:
            try:
                verify_sums(sub, cover=LEXICAL_FILES)
            except ChecksumError as exc:
                raise ModelLoadError(f"HyReC model {folder}: {exc}; save or train it again") from None
        else:
            warn(f"HyReC model {folder} was saved before {SUBDIR}/{SUMS} existed: its lexical files are not "
                 "checked; save it again (HyReCModel.save) to add them")
        try:
            return HyReCConfig.from_dict(json.loads((sub / "config.json").read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError) as exc:
            raise ModelLoadError(f"HyReC model {folder}: cannot read {SUBDIR}/config.json ({exc})") from None

    @classmethod
    def load(cls, folder: str | Path, device: str | None = None) -> HyReCModel:
        from safetensors.torch import load_file

        folder = Path(folder)
        sub = folder / SUBDIR
        config = cls.read_config(folder)  # the sums of hyrec/ are checked here, before anything is read
        try:
            words = WordVocab.from_json(json.loads((sub / "words.json").read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:  # format 1 folders (no sums): a damaged file is still one error
            raise ModelLoadError(f"HyReC model {folder}: cannot read {SUBDIR}/words.json ({exc})") from None
        st = load(str(folder), device="cpu")
        model = cls(st, config, words=words)
        state = load_file(str(sub / "lexical.safetensors"))
        for prefix, module in (("lexicon.", model.lexicon), ("weight_proj.", model.weight_proj),
                               ("union_proj.", model.union_proj)):
            part = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            module.load_state_dict(part, strict=True)
        return model.to(device) if device else model


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


def _register_retrieval_encoder() -> None:
    """Let retrieval index folders reload a HyReC model by name (encoder tag ``"hyrec"``) and recognise a
    HyReC folder (it holds ``hyrec/config.json``)."""
    register_encoder(EncoderKind(
        tag=HyReCModel.encoder_tag,
        load=lambda folder, device=None: HyReCModel.load(folder, device=device),
        detect=lambda folder: (Path(folder) / SUBDIR / "config.json").is_file(),
    ))


_register_retrieval_encoder()
