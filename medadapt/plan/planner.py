"""``plan_recipe``: parameters, memory per device, tokens per step and the gradient accumulation a recipe
needs on given hardware, from architecture configs alone. For each phase: the largest per-device micro-batch
that fits, and the accumulation that keeps the phase's global batch (GradCache-exact, so it changes memory, not
the result); a phase whose state plus one example's activations does not fit is refused with the numbers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from medadapt import systems
from medadapt.errors import ConfigError, MedAdaptError
from medadapt.plan.configs import Architecture, architecture
from medadapt.plan.hardware import Hardware
from medadapt.plan.memory import activation_bytes, state_bytes
from medadapt.plan.specs import PlanSpec

__all__ = ["DoesNotFit", "ModelPlan", "PhasePlan", "Plan", "describe_recipe", "plan_recipe"]

GiB = 2**30


class DoesNotFit(MedAdaptError):
    """The recipe cannot train on the declared hardware at any gradient accumulation; the message says why."""


def describe_recipe(recipe) -> PlanSpec:
    """The :class:`PlanSpec` of a validated recipe, from its system's ``plan``."""
    system = systems.find(recipe.kind)
    if system is None or system.plan is None:
        planned = sorted(s.kind for s in systems.registered() if s.plan is not None)
        raise ConfigError(f"recipe kind {recipe.kind!r} has no planner (planned kinds: "
                          f"{', '.join(planned) or 'none'})")
    return system.plan(recipe)


@dataclass
class ModelPlan:
    role: str
    model: str | None
    config: str
    total_params: int
    trainable_params: int
    frozen_params: int
    how: str  # "LoRA r=32", "full", "frozen", "head"
    built_on_meta: bool


@dataclass
class PhasePlan:
    name: str
    global_batch: int
    declared_batch_size: int
    declared_accumulation: int
    tokens_per_step: int
    weights_gb: float
    gradients_gb: float
    optimizer_gb: float
    extra_gb: float
    activations_per_example_gb: float
    activations_per_example_no_ckpt_gb: float
    micro_batch: int = 0  # per device, per forward pass
    accumulation: int = 0  # forward passes per optimizer step for the global batch
    activations_gb: float = 0.0
    activations_no_ckpt_gb: float = 0.0
    embeddings_gb: float = 0.0
    peak_gb: float = 0.0
    fits: bool = True
    reason: str = ""
    checkpointing: bool = False

    @property
    def state_gb(self) -> float:
        return self.weights_gb + self.gradients_gb + self.optimizer_gb + self.extra_gb

    def recipe_fix(self) -> str:
        """The batch_size / gradient_accumulation_steps that keep the global batch with this accumulation (the
        examples the recipe declares per step, global or per device, over the new accumulation)."""
        declared = self.declared_batch_size * self.declared_accumulation
        return (f"batch_size={math.ceil(declared / self.accumulation)} "
                f"gradient_accumulation_steps={self.accumulation}")


@dataclass
class Plan:
    recipe: str
    hardware: str
    usable_gb: float
    models: list[ModelPlan]
    phases: list[PhasePlan]
    notes: list[str] = field(default_factory=list)
    data: list[str] = field(default_factory=list)  # PlanSpec.data: what the recipe's training data will be

    @property
    def fits(self) -> bool:
        return all(p.fits for p in self.phases)

    @property
    def peak_gb(self) -> float:
        return max((p.peak_gb for p in self.phases), default=0.0)

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "hardware": self.hardware, "usable_gb_per_device": self.usable_gb,
                "fits": self.fits, "peak_gb_per_device": self.peak_gb,
                "models": [asdict(m) for m in self.models], "phases": [asdict(p) for p in self.phases],
                "notes": list(self.notes), "data": list(self.data)}

    def to_markdown(self) -> str:
        """Two tables (models, phases) and the notes, as pasted into docs/recipes.md."""
        lines = [f"**{self.recipe}** on {self.hardware} (usable {self.usable_gb:.1f} GB per device)", "",
                 "| model | architecture config | parameters | trainable | frozen | trains as |",
                 "|---|---|---:|---:|---:|---|"]
        for m in self.models:
            lines.append(f"| {m.role} | {m.model or '-'} | {_n(m.total_params)} | {_n(m.trainable_params)} | "
                         f"{_n(m.frozen_params)} | {m.how} |")
        lines += ["", "| phase | global batch | tokens / step | weights | grads | optim. | other | "
                  "act. / example (ckpt / no ckpt) | micro-batch / GPU | grad. accum. | peak / GPU | fits |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for p in self.phases:
            lines.append(
                f"| {p.name} | {p.global_batch} | {_n(p.tokens_per_step) if p.tokens_per_step else '-'} | {p.weights_gb:.2f} | {p.gradients_gb:.2f} | "
                f"{p.optimizer_gb:.2f} | {p.extra_gb + p.embeddings_gb:.2f} | "
                f"{_ckpt(p)} | {p.micro_batch or '-'} | {p.accumulation or '-'} | "
                f"{p.peak_gb:.1f} | {'yes' if p.fits else 'NO: ' + p.reason} |")
        lines.append("")
        lines.append("Memory in GB (GiB) per device.")
        lines += [f"- {p.name}: the global batch {p.global_batch} needs {p.accumulation} gradient-accumulation steps "
                  f"(recipe: {p.declared_accumulation}): `{p.recipe_fix()}`"
                  for p in self.phases if p.fits and p.accumulation > p.declared_accumulation]
        lines += [f"- {n}" for n in self.notes]
        lines += [f"- data: {d}" for d in self.data]
        return "\n".join(lines)


def _ckpt(p: PhasePlan) -> str:
    if p.checkpointing:
        return f"{p.activations_per_example_gb:.3f} / {p.activations_per_example_no_ckpt_gb:.3f}"
    return f"- / {p.activations_per_example_no_ckpt_gb:.3f}"


def _n(x: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if x >= div:
            return f"{x / div:.3g}{unit}"
    return str(x)


def plan_recipe(recipe, hardware: Hardware | None = None, *, spec: PlanSpec | None = None,
                recipe_source: str | None = None, strict: bool = True) -> Plan:
    """Plan ``recipe`` (a validated recipe, or give ``spec`` directly) on ``hardware``. With ``strict``, a
    phase that cannot fit raises :class:`DoesNotFit` naming the phase and the numbers."""
    hw = hardware or Hardware()
    spec = spec or describe_recipe(recipe)
    source = recipe_source or (getattr(recipe, "_source", None) if recipe is not None else None)
    mp = hw.mixed_precision if hw.mixed_precision not in (None, "no") else spec.mixed_precision
    roles = {m.role: m for m in spec.models}
    training_roles = {u.role for ph in spec.phases for u in ph.uses if u.trains}
    archs: dict[str, Architecture] = {}
    models = []
    for m in spec.models:
        trains = m.role in training_roles
        if m.model is None:  # a head outside any transformer: only its parameter count
            archs[m.role] = None  # type: ignore[assignment]
            models.append(ModelPlan(m.role, None, "-", m.head_params, m.head_params if trains else 0,
                                    0 if trains else m.head_params, "head" if trains else "frozen", False))
            continue
        a = architecture(m, trains=trains, recipe_source=source)
        archs[m.role] = a
        how = ("frozen" if not trains else f"LoRA r={m.lora.r}" if m.lora else "full")
        models.append(ModelPlan(m.role, m.model, a.source, a.total_params, a.trainable_params, a.frozen_params,
                                how, a.built_on_meta))
    phases = []
    n_optimizers = spec.optimizers if spec.optimizers is not None else len(spec.phases)
    for ph in spec.phases:
        trains_here = {u.role for u in ph.uses if u.trains}
        w = g = o = x = 0.0
        for m in spec.models:  # every model of the recipe stays loaded; those this phase does not train
            a = archs[m.role]   # cost their weights only
            if a is None:
                p_t = m.head_params if m.role in trains_here else 0
                w += m.head_params * 4
                g += p_t * 4
                o += p_t * 8
                continue
            trains = m.role in trains_here
            sb = state_bytes(a if trains else replace(a, trainable_params=0), roles[m.role], hw, mp, trains)
            w, g, o, x = w + sb.weights, g + sb.gradients, o + sb.optimizer, x + sb.extra
        act = act_nockpt = 0.0
        ckpt = False
        emb_dim = ph.embedding_dim
        for u in ph.uses:
            a, m = archs[u.role], roles[u.role]
            if a is None or not u.trains:
                continue
            act += u.texts * activation_bytes(a, m, u.seq_len, mp)
            act_nockpt += u.texts * activation_bytes(a, m, u.seq_len, mp, checkpointing=False)
            ckpt = ckpt or m.gradient_checkpointing
            emb_dim = emb_dim or a.hidden
        act += ph.extra_bytes_per_example
        act_nockpt += ph.extra_bytes_per_example
        texts = sum(u.texts for u in ph.uses if archs[u.role] is not None)
        batch = ph.batch_on(hw.num_gpus)  # a per-device batch_size: each device gets exactly its own
        # tokens through a transformer with gradients per optimizer step (cached / no-grad inputs excluded)
        tokens = batch * sum(u.texts * u.seq_len for u in ph.uses if archs[u.role] is not None and u.trains)
        # GradCache keeps the whole optimizer step's embeddings and their gradients (float32), gathered
        emb = batch * texts * emb_dim * 4 * 2
        pp = PhasePlan(ph.name, batch, ph.batch_size, ph.gradient_accumulation_steps, tokens,
                       w / GiB, g / GiB, o / GiB, x / GiB, act / GiB, act_nockpt / GiB, embeddings_gb=emb / GiB,
                       checkpointing=ckpt)
        _fit(pp, hw, act, emb)
        accumulating = pp.accumulation > 1 or ph.gradient_accumulation_steps > 1  # needed, or declared
        if pp.fits and accumulating and hw.strategy == "deepspeed" and not spec.engine_accumulation:
            pp.fits = False
            what = (f"needs {pp.accumulation} gradient-accumulation steps" if pp.accumulation > 1 else
                    f"declares gradient_accumulation_steps={ph.gradient_accumulation_steps}")
            pp.reason = (f"{what}, which medadapt's training loop does not run under DeepSpeed; launch with DDP "
                         "(recipes/accelerate/multi-gpu.yaml) or FSDP (recipes/accelerate/fsdp.yaml)")
        if pp.fits and hw.strategy == "deepspeed" and not spec.engine_accumulation and n_optimizers > 1:
            pp.fits = False
            pp.reason = (f"medadapt's training loop trains this recipe with {n_optimizers} separate optimizers, and "
                         "DeepSpeed prepares one model with one optimizer; launch with DDP "
                         "(recipes/accelerate/multi-gpu.yaml) or FSDP (recipes/accelerate/fsdp.yaml)")
        phases.append(pp)
    plan = Plan(spec.recipe, hw.describe(), hw.usable_bytes / GiB, models, phases, list(spec.notes),
                list(spec.data))
    bad = [p for p in phases if not p.fits]
    if strict and bad:
        raise DoesNotFit(f"{spec.recipe} cannot fit on {hw.describe()} (usable {hw.usable_bytes / GiB:.1f} GB per "
                         "device): " + "; ".join(f"{p.name}: {p.reason}" for p in bad))
    return plan


def _fit(pp: PhasePlan, hw: Hardware, act_per_example: float, emb: float) -> None:
    """Largest per-device micro-batch that fits, and the accumulation that keeps the global batch."""
    usable = hw.usable_bytes
    static = pp.state_gb * GiB + emb
    per_device = math.ceil(pp.global_batch / hw.num_gpus)
    if static + act_per_example > usable:
        pp.fits = False
        alone = static > usable
        what = ("weights + gradients + optimizer state alone" if alone else
                "weights + gradients + optimizer state + one example's activations")
        need = static if alone else static + act_per_example
        pp.reason = (f"{what} need {need / GiB:.1f} GB per device > {usable / GiB:.1f} GB usable "
                     f"(state {pp.state_gb:.1f} GB, one example's activations {act_per_example / GiB:.2f} GB)")
        if hw.num_gpus > 1 and hw.shard_stage < 3:
            pp.reason += (f"; sharding the weights over the {hw.num_gpus} GPUs (FSDP FULL_SHARD or ZeRO-3, e.g. "
                          "--accelerate-config recipes/accelerate/fsdp.yaml) divides them")
        pp.peak_gb = (static + act_per_example) / GiB
        return
    most = int((usable - static) // act_per_example) if act_per_example else per_device
    micro = max(1, min(per_device, most))
    need = math.ceil(per_device / micro)
    # prefer an accumulation that splits the global batch exactly over passes and devices (the paper's batch)
    exact = [k for k in range(need, min(4 * need, pp.global_batch) + 1)
             if pp.global_batch % k == 0 and (pp.global_batch // k) % hw.num_gpus == 0
             and pp.global_batch // k // hw.num_gpus <= micro]
    pp.accumulation = exact[0] if exact else need
    pp.micro_batch = math.ceil(per_device / pp.accumulation)
    pp.activations_gb = pp.micro_batch * act_per_example / GiB
    pp.activations_no_ckpt_gb = pp.micro_batch * pp.activations_per_example_no_ckpt_gb
    pp.peak_gb = pp.state_gb + pp.embeddings_gb + pp.activations_gb
