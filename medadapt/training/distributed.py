"""Data-parallel helpers of medadapt's one training loop (:mod:`medadapt.training.loop`).

A loss on one process's shard alone would see ``B / N`` in-batch negatives instead of ``B``. The loop splits
each global batch with :func:`shard_bounds` (contiguous, balanced, rank order), all-gathers the outputs with
:func:`gather_with_grad` (the local slice keeps its gradient), computes the global loss on every process,
scales the local slice's gradient by ``N`` and averages gradients (:func:`average_gradients`), so ``N``
processes train as one. With one process every helper is the identity / a no-op. See docs/training.md.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

__all__ = ["average_gradients", "broadcast_parameters", "close_process_group", "fsdp_outside_modules",
           "fsdp_requested", "fsdp_wrap_policy", "gather_with_grad", "is_distributed", "shard_bounds",
           "use_fsdp_wrap_policy"]


def is_distributed() -> bool:
    """``True`` when a ``torch.distributed`` process group with more than one process is running."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def fsdp_requested() -> bool:
    """``True`` when this process trains under FSDP: started by ``accelerate launch`` with an FSDP config
    (``ACCELERATE_USE_FSDP``), or an ``Accelerator`` with an FSDP plugin already exists. Models are built
    after the run's ``Accelerator``, so loaders can adapt to FSDP before it wraps them."""
    import os

    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true", "yes"):
        return True
    try:
        from accelerate.state import AcceleratorState
    except ImportError:  # pragma: no cover - accelerate is a dependency
        return False
    kind = AcceleratorState._shared_state.get("distributed_type")
    return kind is not None and "FSDP" in str(kind)


def fsdp_wrap_policy(model: torch.nn.Module):
    """The FSDP1 auto-wrap policy for ``model`` (a ``torch.distributed.fsdp.wrap.CustomPolicy``), or ``None``
    when nothing inside it should be a unit of its own.

    - Every transformer layer is a unit: the ``_no_split_modules`` classes of each Hugging Face model
      *inside* ``model`` (Accelerate's ``TRANSFORMER_BASED_WRAP`` reads the root's only, which a
      ``SentenceTransformer`` lacks).
    - With some parameters frozen (LoRA), every leaf module of a Hugging Face model that has a trainable
      parameter is a unit too, so frozen weights sharing its flat parameter get no gradients.

    This is PEFT's ``fsdp_auto_wrap_policy`` applied to the models inside a ``SentenceTransformer``. Only
    leaves their Hugging Face model's forward calls are split off; parameters of modules with children,
    heads outside the Hugging Face model, modules a step calls directly (a learnable temperature) and tied
    weights stay in the enclosing unit. The trainable set is read now: call this right before wrapping."""

    names: set[str] = set()
    inside: set[int] = set()  # modules of Hugging Face models, which their model's forward calls
    for module in model.modules():
        declared = getattr(module, "_no_split_modules", None)
        if isinstance(declared, (list, tuple, set)):
            names.update(str(n) for n in declared)
            inside.update(id(m) for m in module.modules() if m is not module)
    flags = {p.requires_grad for p in model.parameters()}
    owners: dict[int, list[int]] = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            owners.setdefault(id(p), []).append(id(module))

    def self_contained(module: torch.nn.Module) -> bool:  # no parameter shared with a module outside it
        subtree = {id(m) for m in module.modules()}
        return all(o in subtree for p in module.parameters() for o in owners[id(p)])

    units: set[int] = set()
    for module in model.modules():
        if module is model:
            continue
        if type(module).__name__ in names:
            if self_contained(module):
                units.add(id(module))
        elif flags == {True, False} and id(module) in inside and next(module.children(), None) is None:
            if any(p.requires_grad for p in module.parameters(recurse=False)) and self_contained(module):
                units.add(id(module))
    if not units:
        return None

    return _marked_policy(lambda module: id(module) in units)


def _marked_policy(wrap) -> object:
    """A ``CustomPolicy`` marked as medadapt's, which :func:`use_fsdp_wrap_policy` replaces on the next wrap."""
    from torch.distributed.fsdp.wrap import CustomPolicy

    policy = CustomPolicy(wrap)
    policy._medadapt = True  # type: ignore[attr-defined]
    return policy


def fsdp_outside_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of ``model`` that declare ``called_outside_forward = True``: a training step calls them
    directly rather than through ``model``'s forward, e.g. a loss with a learnable temperature, called on
    outputs gathered from every process. FSDP1 gathers a unit's parameters only around the wrapped forward; a
    parameter read outside it is a view of FSDP's flat parameter, and on CPU CARE's unsupervised phase failed
    there with an autograd view error. FSDP leaves these modules out (``ignored_modules``): their parameters
    stay whole on every process, and the loop averages their gradients itself."""
    return [m for m in model.modules() if getattr(m, "called_outside_forward", False)]


def use_fsdp_wrap_policy(accelerator, model: torch.nn.Module) -> bool:
    """Before ``accelerator`` wraps ``model`` with FSDP1, give its FSDP plugin :func:`fsdp_wrap_policy`
    (``model``) in place of ``TRANSFORMER_BASED_WRAP`` without explicit layer classes (what
    ``recipes/accelerate/fsdp.yaml`` declares); a policy the user chose (size-based, ``NO_WRAP``, named layer
    classes) is kept. ``True`` when the policy splits units off (a model with nothing to split off gets the
    root unit alone). Works with an ``Accelerator`` or anything with
    ``.state.fsdp_plugin`` (Hugging Face's Trainer: ``trainer.accelerator``). The plugin's
    ``ignored_modules`` become :func:`fsdp_outside_modules` (``model``) unless the user named some."""
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    plugin = getattr(getattr(accelerator, "state", None), "fsdp_plugin", None)
    if plugin is None or int(getattr(plugin, "fsdp_version", 1) or 1) != 1:
        return False  # FSDP2 shards each parameter on its own: frozen weights never share a gradient
    if plugin.ignored_modules is None or getattr(plugin, "_medadapt_ignored", False):
        outside = fsdp_outside_modules(model)
        plugin.ignored_modules = outside or None
        plugin._medadapt_ignored = True
    current = plugin.auto_wrap_policy
    default = current is transformer_auto_wrap_policy and not getattr(plugin, "transformer_cls_names_to_wrap", None)
    if not (default or getattr(current, "_medadapt", False)):
        return False
    policy = fsdp_wrap_policy(model)
    if policy is None:  # nothing to split off: the root unit alone, still ours to replace at the next wrap
        plugin.auto_wrap_policy = _marked_policy(lambda module: False)
        return False
    plugin.auto_wrap_policy = policy
    return True


def close_process_group() -> None:
    """Destroy the default ``torch.distributed`` process group, if one is running (a no-op otherwise).

    Commands started by ``accelerate launch`` call this on every process before returning: a process that
    leaves the group to interpreter shutdown can abort there (``terminate called without an active
    exception``, seen in CI when a worker with nothing left to do exited while the main process was still
    writing its report), which fails the whole launch although the work was done."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def shard_bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    """``(start, stop)`` of process ``rank``'s contiguous shard of ``n`` items: balanced, earlier shards one
    larger (``numpy.array_split`` rule: 10 items on 4 processes -> 3, 3, 2, 2). Shards concatenated in rank
    order are the items in their original order."""
    if n < 0 or not 0 <= rank < world:
        raise ValueError(f"need n >= 0 and rank in [0, world), got n={n}, rank={rank}, world={world}")
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def gather_with_grad(tensor: Tensor) -> Tensor:
    """All-gather ``tensor`` along dim 0 from every process, in rank order; the local slice *is* ``tensor``
    (gradients flow into it), the other processes' slices are detached copies. Shards may differ in size
    along dim 0 (padded for the collective, cut back); boolean tensors are sent as ``uint8``. Identity with
    one process."""
    if not is_distributed():
        return tensor
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    local = torch.tensor([tensor.shape[0]], dtype=torch.long, device=tensor.device)
    every = [torch.zeros_like(local) for _ in range(world)]
    dist.all_gather(every, local)
    sizes = [int(s) for s in every]
    send = tensor.detach()
    is_bool = send.dtype == torch.bool
    if is_bool:
        send = send.to(torch.uint8)
    longest = max(sizes)
    if send.shape[0] < longest:
        send = torch.cat([send, send.new_zeros((longest - send.shape[0], *send.shape[1:]))])
    received = [torch.empty_like(send) for _ in range(world)]
    dist.all_gather(received, send.contiguous())
    pieces = [r[:s].to(torch.bool) if is_bool else r[:s] for r, s in zip(received, sizes)]
    pieces[rank] = tensor
    return torch.cat(pieces)


def average_gradients(params: Iterable[torch.nn.Parameter]) -> None:
    """Average the ``.grad`` of ``params`` over processes (what DDP does during backward), for loops that
    do not wrap their model in DDP. A gradient missing on some processes counts as zeros there (e.g. an
    expert no local input was routed to); a parameter without a gradient on *every* process keeps
    ``grad=None``, so the optimiser skips it exactly as a single process would (AdamW would otherwise
    apply weight decay and momentum to it). One flat all-reduce. No-op with one process."""
    if not is_distributed():
        return
    import torch.distributed as dist

    params = [p for p in params if p.requires_grad]
    if not params:
        return
    device = params[0].device
    grads = [p.grad.reshape(-1).float() if p.grad is not None else torch.zeros(p.numel(), device=device)
             for p in params]
    present = torch.tensor([float(p.grad is not None) for p in params], device=device)
    flat = torch.cat([*grads, present])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= dist.get_world_size()
    offset = 0
    anywhere = flat[-len(params):] > 0
    for p, used in zip(params, anywhere.tolist()):
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).to(p.dtype).clone() if used else None
        offset += n


def broadcast_parameters(params: Iterable[torch.nn.Parameter], src: int = 0) -> None:
    """Copy ``params`` from process ``src`` to every process (what DDP does when it wraps a model), so
    replicas start identical even if their initialisation drew different random numbers. No-op with one
    process."""
    if not is_distributed():
        return
    import torch.distributed as dist

    with torch.no_grad():
        for p in params:
            dist.broadcast(p.data, src=src)
