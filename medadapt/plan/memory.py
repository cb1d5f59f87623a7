"""The memory model of :func:`medadapt.plan.plan_recipe`: bytes per device for weights, gradients, optimizer
state and activations (after Korthikanti et al. 2022; formulas in docs/recipes.md, "How the plan counts
memory"). Hand-written: no library estimates the *training* memory of a model without allocating it.
"""

from __future__ import annotations

from dataclasses import dataclass

from medadapt.plan.configs import Architecture
from medadapt.plan.hardware import Hardware
from medadapt.plan.specs import ModelSpec

__all__ = ["StateBytes", "activation_bytes", "dtype_bytes", "state_bytes", "step_peak_bytes"]

_DTYPE = {None: 4, "float32": 4, "bfloat16": 2, "float16": 2}


def dtype_bytes(torch_dtype: str | None) -> int:
    return _DTYPE.get(torch_dtype, 4)


def act_bytes(spec: ModelSpec, mixed_precision: str | None) -> int:
    """Bytes per activation element: 2 under bf16/fp16 autocast or with 16-bit weights, else 4."""
    return 2 if (mixed_precision in ("bf16", "fp16") or dtype_bytes(spec.torch_dtype) == 2) else 4


def activation_bytes(arch: Architecture, spec: ModelSpec, seq_len: int, mixed_precision: str | None,
                     *, checkpointing: bool | None = None) -> int:
    """Activation bytes kept for backward for ONE sequence of ``seq_len`` tokens (docs/recipes.md)."""
    e = act_bytes(spec, mixed_precision)
    s, h = seq_len, arch.hidden
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    i = arch.intermediate
    if spec.lora is None or not arch.lora_targets or "all" in arch.lora_groups:
        norms = 3 if arch.rms_norm else 2
        elems = norms * 2 * h + 3 * q + 2 * kv + (4 if arch.gated_mlp else 2) * i
        if arch.qk_norm:
            elems += 2 * q + 2 * kv
    else:  # frozen base: only tensors some gradient still needs (docs/recipes.md)
        g = arch.lora_groups
        elems = 2 * h + 2 * q + 2 * kv  # norm inputs, rotated Q, attention output, K, V
        elems += h * (("attn_in" in g) + ("mlp_in" in g))  # norm outputs read by a LoRA
        elems += q * ("attn_out" in g) + i * ("mlp_out" in g)
        elems += (3 if arch.gated_mlp else 1) * i
        if arch.qk_norm:
            elems += q + kv
    layer = e * s * elems
    if arch.hidden_dropout > 0:
        layer += s * 2 * h
    if spec.attn_implementation == "eager":
        layer += arch.heads * s * s * (e + ((1 + e) if arch.attention_dropout > 0 else 0))
    if spec.lora is not None and arch.lora_targets:
        layer += e * s * spec.lora.r * arch.lora_targets
        if spec.lora.dropout > 0:
            layer += (e + 1) * s * arch.lora_in_features
    outside = e * s * (3 if arch.rms_norm else 2) * h
    if spec.lora is not None and arch.lora_targets and "all" not in arch.lora_groups:  # frozen base
        outside += e * s * ((3 if arch.gated_mlp else 2) * i + h)  # one layer's backward working set
    ckpt = spec.gradient_checkpointing if checkpointing is None else checkpointing
    if ckpt:
        return arch.layers * e * s * h + layer + outside
    return arch.layers * layer + outside


@dataclass(frozen=True)
class StateBytes:
    """Per-device bytes of one model's state (everything but activations)."""

    weights: float
    gradients: float
    optimizer: float
    extra: float  # autocast copies, DDP buckets, FSDP / ZeRO-3 gathered layers

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.extra


def state_bytes(arch: Architecture, spec: ModelSpec, hw: Hardware, mixed_precision: str | None,
                trains: bool) -> StateBytes:
    """Weights, gradients, optimizer state and extras of one model on one device (docs/recipes.md)."""
    b = dtype_bytes(spec.torch_dtype)
    p_t = arch.trainable_params if trains else 0
    p_f = arch.total_params - p_t
    mp16 = mixed_precision in ("bf16", "fp16")
    n, stage = hw.shards, hw.shard_stage
    if hw.strategy == "deepspeed" and mp16:
        w_f, w_t, g, o = 2.0, 2.0, 2.0, 12.0
        autocast = 0.0
    else:
        bt = 4 if spec.lora is not None else b
        # FSDP flattens one dtype per module: attach_lora upcasts a half-precision model under LoRA to float32
        bf = 4 if (hw.strategy == "fsdp" and spec.lora is not None) else b
        w_f, w_t, g, o = float(bf), float(bt), float(bt), 2.0 * bt
        autocast = 2.0 * p_t if (mp16 and bt == 4) else 0.0
    sharded = hw.strategy in ("deepspeed", "fsdp")
    weights = p_f * w_f + p_t * w_t
    grads, optim = p_t * g, p_t * o
    # Under FSDP the frozen weights get no gradient memory: medadapt's wrap policy
    # (medadapt.training.distributed.fsdp_wrap_policy) puts LoRA matrices and other trainable modules in FSDP
    # units of their own.
    extra = autocast
    if sharded and stage >= 1:
        optim /= n
    if sharded and stage >= 2:
        grads /= n
    if sharded and stage >= 3:
        weights /= n
        per_layer = arch.total_params / max(arch.layers, 1)
        extra += 2 * per_layer * (w_f if p_t < p_f else w_t)  # the gathered layer and the prefetched one
    if hw.strategy == "ddp" and hw.num_gpus > 1 and p_t:
        extra += p_t * g  # DDP's gradient buckets
    return StateBytes(weights, grads, optim, extra)


def mlm_logit_bytes(masked_tokens: float, vocab_size: int) -> float:
    """Bytes per example of an MLM head's logits on ``masked_tokens`` positions: the bf16 logits, their float32
    copy for the cross-entropy and its gradient, 10 bytes per logit."""
    return float(masked_tokens) * int(vocab_size) * 10


def step_peak_bytes(state: StateBytes, activations: float, embeddings: float = 0.0) -> float:
    """The peak of one process's step when the batch is one forward pass: backward trades activations for
    gradients, so it holds the larger of the two, not both (the planner reports the sum, an upper bound)."""
    return state.weights + state.optimizer + state.extra + max(state.gradients, activations) + embeddings
