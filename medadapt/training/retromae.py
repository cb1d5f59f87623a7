"""RetroMAE pre-training of a sentence-transformers encoder (Xiao et al. 2022; CARE Appendix C.1.1, HyReC
§4.1.3): moderate masking for the encoder, aggressive masking for a one-layer decoder that sees only the
encoder's [CLS] embedding; loss = MLM of both, one head tied to the word embeddings. Built on transformers'
masking, ``BertLayer`` and ``BertOnlyMLMHead``, the glue hand-written so the stage runs through the one loop.
The encoder trains in place; decoder and head are dropped afterwards."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import Tensor, nn

from medadapt.errors import ConfigError
from medadapt.training.config import OptimSection
from medadapt.training.loop import Batch, LoopResult, Stage, train
from medadapt.training.lora import first_transformer
from medadapt.training.steps import trainable_only

__all__ = ["RetroMAEPretrainer", "RetroMAESection", "RetroMAEStep", "pretrain_retromae", "retromae_stage"]


class RetroMAESection(OptimSection):
    """Optimisation plus masking of the RetroMAE stage. ``max_length`` defaults to the encoder's
    ``max_seq_length``."""

    encoder_mask_ratio: float = Field(0.3, gt=0, lt=1, description="share of the encoder's tokens masked")
    decoder_mask_ratio: float = Field(0.5, gt=0, lt=1, description="share of the decoder's tokens masked")
    max_length: int | None = Field(None, ge=8)

    @model_validator(mode="after")
    def _ratios(self) -> RetroMAESection:
        if self.decoder_mask_ratio < self.encoder_mask_ratio:
            raise ValueError(f"decoder_mask_ratio ({self.decoder_mask_ratio}) must be >= encoder_mask_ratio "
                             f"({self.encoder_mask_ratio}): RetroMAE masks the decoder's copy more aggressively")
        return self


def _bert_config(config) -> Any:
    """A ``BertConfig`` with the encoder's widths (for the decoder layer and the MLM head)."""
    from transformers import BertConfig

    hidden = getattr(config, "hidden_size", None)
    if hidden is None or getattr(config, "vocab_size", None) is None:
        raise ConfigError(f"RetroMAE needs an encoder config with hidden_size and vocab_size ({type(config).__name__})")
    out = BertConfig(
        vocab_size=config.vocab_size, hidden_size=hidden,
        num_attention_heads=getattr(config, "num_attention_heads", max(1, hidden // 64)),
        intermediate_size=getattr(config, "intermediate_size", 4 * hidden),
        hidden_act=getattr(config, "hidden_act", "gelu") if isinstance(getattr(config, "hidden_act", None), str)
        else "gelu",
        layer_norm_eps=getattr(config, "layer_norm_eps", 1e-12),
        hidden_dropout_prob=getattr(config, "hidden_dropout_prob", 0.1),
        attention_probs_dropout_prob=getattr(config, "attention_probs_dropout_prob", 0.1),
        max_position_embeddings=getattr(config, "max_position_embeddings", 512),
    )
    out._attn_implementation = "eager"
    return out


class RetroMAEPretrainer(nn.Module):
    """The encoder (shared, trained in place) + a one-layer decoder + one MLM head tied to the encoder's word
    embeddings. ``forward`` takes the masked batch and returns per-text loss sums and counts."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        from transformers.models.bert.modeling_bert import BertLayer, BertOnlyMLMHead

        self.encoder = encoder
        cfg = _bert_config(encoder.config)
        self.decoder_positions = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.decoder_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.decoder_dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.decoder = BertLayer(cfg)
        self.head = BertOnlyMLMHead(cfg)
        words = encoder.get_input_embeddings()
        self.head.predictions.decoder.weight = words.weight  # tied, as in BertForMaskedLM
        device = words.weight.device
        for module in (self.decoder_positions, self.decoder_norm, self.decoder, self.head):
            module.to(device)

    def forward(self, enc_ids: Tensor, enc_labels: Tensor, dec_ids: Tensor, dec_labels: Tensor,
                attention_mask: Tensor) -> dict[str, Tensor]:
        hidden = self.encoder(input_ids=enc_ids, attention_mask=attention_mask).last_hidden_state
        enc_sum, enc_n = _mlm_sums(self.head, hidden, enc_labels)
        words = self.encoder.get_input_embeddings()(dec_ids[:, 1:])
        positions = self.decoder_positions(torch.arange(1, dec_ids.shape[1], device=dec_ids.device))
        tokens = self.decoder_dropout(self.decoder_norm(words + positions))
        x = torch.cat([hidden[:, :1].to(tokens.dtype), tokens], dim=1)
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        out = self.decoder(x, attention_mask=mask)
        out = out[0] if isinstance(out, tuple) else out
        dec_sum, dec_n = _mlm_sums(self.head, out, dec_labels)
        return {"encoder_sum": enc_sum, "encoder_count": enc_n, "decoder_sum": dec_sum, "decoder_count": dec_n}


def _mlm_sums(head: nn.Module, hidden: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Per-text sum of token cross-entropies over the masked positions, and their count. The head runs on
    the masked positions only (a vocabulary-sized output per token is most of the step's memory)."""
    selected = labels != -100
    ce = F.cross_entropy(head(hidden[selected]).float(), labels[selected], reduction="none")
    rows = selected.nonzero()[:, 0]
    sums = torch.zeros(labels.shape[0], device=ce.device, dtype=ce.dtype).index_add(0, rows, ce)
    return sums, selected.sum(dim=1).float()


class RetroMAEStep:
    """Tokenise and mask a chunk of ``texts`` twice and run :class:`RetroMAEPretrainer`; ``loss`` is the
    mean token loss of encoder + decoder over the whole step (sums / counts: accumulation and sharding exact)."""

    def __init__(self, tokenizer, texts: Sequence[str], section: RetroMAESection, max_length: int) -> None:
        from transformers import DataCollatorForLanguageModeling

        if tokenizer.mask_token is None:
            raise ConfigError("RetroMAE needs a tokenizer with a mask token")
        self.tokenizer, self.texts, self.max_length = tokenizer, texts, max_length
        self.enc = DataCollatorForLanguageModeling(tokenizer, mlm_probability=section.encoder_mask_ratio)
        self.dec = DataCollatorForLanguageModeling(tokenizer, mlm_probability=section.decoder_mask_ratio)

    def forward(self, run_model: nn.Module, batch: Batch) -> dict[str, Tensor]:
        feats = self.tokenizer([self.texts[i] for i in batch.indices], padding=True, truncation=True,
                               max_length=self.max_length, return_tensors="pt", return_special_tokens_mask=True)
        ids, attn = feats["input_ids"], feats["attention_mask"]
        special = feats["special_tokens_mask"].bool() | (attn == 0)
        enc_ids, enc_labels = self.enc.torch_mask_tokens(ids.clone(), special)
        dec_ids, dec_labels = self.dec.torch_mask_tokens(ids.clone(), special)
        device = next(run_model.parameters()).device
        return run_model(enc_ids.to(device), enc_labels.to(device), dec_ids.to(device), dec_labels.to(device),
                         attn.to(device))

    def loss(self, outputs: dict[str, Tensor], batch: Batch) -> dict[str, Tensor]:
        return {"mlm_encoder": outputs["encoder_sum"].sum() / outputs["encoder_count"].sum().clamp(min=1),
                "mlm_decoder": outputs["decoder_sum"].sum() / outputs["decoder_count"].sum().clamp(min=1)}


def retromae_stage(model, texts: Sequence[str], section: RetroMAESection, *,
                   name: str = "retromae") -> tuple[RetroMAEPretrainer, Stage]:
    """``(pretrainer, stage)``: train ``pretrainer``, whose ``encoder`` is the Hugging Face model of
    ``model``'s first ``Transformer`` (``model`` changes in place)."""
    if not texts:
        raise ConfigError(f"RetroMAE stage {name!r}: no texts")
    transformer = first_transformer(model)
    pretrainer = RetroMAEPretrainer(transformer.model)
    max_length = section.max_length or transformer.max_seq_length or 512
    step = RetroMAEStep(transformer.tokenizer, texts, section, max_length)
    return pretrainer, Stage(name, len(texts), step, list(pretrainer.parameters()), section)


def pretrain_retromae(model, texts: Sequence[str], section: RetroMAESection, **train_kwargs: Any) -> LoopResult:
    """RetroMAE pre-training of ``model``'s encoder in place; ``train_kwargs`` go to
    :func:`medadapt.training.loop.train`."""
    pretrainer, stage = retromae_stage(model, texts, section)
    with trainable_only(pretrainer, stage.params):  # every flag restored afterwards
        return train(pretrainer, [stage], **train_kwargs)
