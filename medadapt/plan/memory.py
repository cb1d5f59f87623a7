"""The memory model of :func:`medadapt.plan.plan_recipe`: bytes per device for weights, gradients,
optimizer state and activations. Written by hand because no library estimates *training* memory of an
arbitrary (LoRA / frozen / checkpointed) model without allocating it: ``accelerate estimate-memory``
covers weights and a fixed Adam multiple only, DeepSpeed's estimators cover ZeRO state but no
activations.

**Weights, gradients, optimizer state** (``P_t`` trainable, ``P_f`` frozen parameters; ``b`` the bytes of
the loaded dtype, 4 without ``torch_dtype``):

* frozen weights ``P_f * b``; trainable weights ``P_t * b_t`` where ``b_t = 4`` for LoRA (PEFT keeps
  adapters in float32) and ``b`` for full fine-tuning; gradients ``P_t * b_t``; AdamW's two moments
  ``2 * P_t * b_t`` (torch keeps them in the parameter's dtype);
* under mixed precision with float32 trainable weights, autocast keeps a 16-bit copy of them for the
  step (``2 * P_t``);
* DeepSpeed with bf16/fp16 holds everything in 16 bits plus an fp32 master copy and moments in the
  optimizer (ZeRO paper: 2 + 2 + 12 bytes per trainable parameter, 2 per frozen one);
* DDP keeps gradient buckets as large as the gradients; FSDP FULL_SHARD / ZeRO-3 gather one layer at a
  time (two with prefetch) on top of their shard. Sharding as in :mod:`medadapt.plan.hardware`.

**Activations** per sequence of ``s`` tokens (``e`` = 2 bytes under bf16/fp16 or a 16-bit ``torch_dtype``,
else 4), counting the distinct tensors autograd keeps for backward (after Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", generalised to GQA and gated MLPs):

* per layer ``e * s * (n*2h + 3q + 2kv + c*I)``: the two norms (``n = 3`` for the RMSNorms of the
  Llama family, written in Python: input, normalised input, output; ``n = 2`` for ``nn.LayerNorm``: input
  and output), rotated Q, the attention output and the output projection's (reshaped) input (``3q``,
  ``q = heads * head_dim``), rotated K and V (``2kv``, ``kv = kv_heads * head_dim``; SDPA's grouped-query
  path does not repeat them), Qwen3's per-head Q/K norms (``2q + 2kv`` more), and the MLP (``c = 4``
  gated: gate, up, act(gate), their product; ``c = 2`` plain: fc1 output and its activation);
* ``+ s * 2h`` bytes of dropout masks when the model has hidden dropout; eager attention adds
  ``heads * s^2`` probabilities (``e`` bytes, ``1 + e`` more with attention dropout); SDPA / flash
  attention (transformers' default) stores no ``s x s`` matrix;
* LoRA adds its rank-``r`` intermediate per wrapped linear, and with LoRA dropout the dropped input and its
  mask (``(e + 1) * in_features``). With the base frozen, autograd keeps only what some gradient still
  needs: the norm inputs, rotated Q/K, V and the attention output (``2h + 2q + 2kv``), the MLP's
  activation input and the two factors of its product (``3I`` gated, ``I`` plain), Qwen3's Q/K norm
  inputs (``q + kv``), and the input of each group of linears that carries a LoRA (attention in ``h``,
  attention out ``q``, MLP in ``h``, MLP out ``I``);
* outside the layers: the final norm's tensors (``3h`` or ``2h``, as above);
* gradient checkpointing (per layer, as transformers does) keeps only each layer's input (``e * s * h``
  per layer) plus one layer's full activations while it is recomputed;
* with the base frozen, one layer's backward working set on top: the activation gradients its MLP
  produces while they are alive together (``3I + h`` gated: the gradients of the product's input, of
  both factors and of the layer input; ``2I + h`` plain). Measured on this CPU (tiny Llama, LoRA r=8 on
  q/v, 16 x 256 tokens, float32): the tensors autograd saved came to 233.5 MiB against 241.0 counted, and
  the step's peak stood ~40 MiB above them, in line with ``3I + h`` (37 MiB); the plan went from 98.9 to
  136 MiB against 138.6 measured with checkpointing, 254.7 to 291.7 against 290.5 without. Full
  fine-tuning has the same transient, but there the planner's sum already holds it: it counts every
  weight gradient beside every activation, although backward frees activations as it fills gradients
  (390.4 MiB measured against 400.9 planned, 166.6 against 164.9 with checkpointing).

**Peak per device** = weights + gradients + optimizer state + activations + GradCache embeddings (the
whole optimizer step's embeddings and their gradients, float32). All counted as alive at once: an upper
bound, since backward frees activations while it fills gradients (see :func:`step_peak_bytes` for the
tighter single-process figure the CPU test compares with).
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
    """Activation bytes kept for backward for ONE sequence of ``seq_len`` tokens (module docstring)."""
    e = act_bytes(spec, mixed_precision)
    s, h = seq_len, arch.hidden
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    i = arch.intermediate
    if spec.lora is None or not arch.lora_targets or "all" in arch.lora_groups:
        norms = 3 if arch.rms_norm else 2
        elems = norms * 2 * h + 3 * q + 2 * kv + (4 if arch.gated_mlp else 2) * i
        if arch.qk_norm:
            elems += 2 * q + 2 * kv
    else:  # frozen base: only tensors some gradient still needs (module docstring, LoRA)
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
    """Weights, gradients, optimizer state and extras of one model on one device (module docstring)."""
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
    # units of their own. Without it, one flat parameter mixed frozen and LoRA weights and took gradients for
    # all of them: 4.13 GiB measured against 2.66 planned for Pythia-410M on an H100.
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
    """Bytes per example of an MLM head's logits on ``masked_tokens`` positions (RetroMAE computes them on
    the masked positions only): the bf16 logits, their float32 copy for the cross-entropy and its gradient,
    10 bytes per logit (float32 training: 12, counted as 10). On an H100 this brought the plan of CARE's
    RetroMAE phase (250k vocabulary) to within 10% of the measured peak (it had counted 12 of 39 GiB)."""
    return float(masked_tokens) * int(vocab_size) * 10


def step_peak_bytes(state: StateBytes, activations: float, embeddings: float = 0.0) -> float:
    """The peak of one process's training step when the whole batch is one forward pass: weights and
    optimizer state stay, while backward trades activations for gradients (each freed tensor is replaced
    by gradients of the layer it belongs to), so the step holds the larger of the two (plus the extras),
    not both. The planner itself reports the sum (an upper bound, safe for sizing)."""
    return state.weights + state.optimizer + state.extra + max(state.gradients, activations) + embeddings
