"""Data-parallel helpers of the one training loop: each global batch is split with :func:`shard_bounds`,
outputs are all-gathered with :func:`gather_with_grad` (the local slice keeps its gradient), every process
computes the global loss and gradients are averaged (:func:`average_gradients`), so ``N`` processes train as one
(a loss on one shard alone would see ``B / N`` in-batch negatives). With one process every helper is a no-op."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["average_gradients", "broadcast_parameters", "close_process_group", "closes_process_group",
           "fsdp_outside_modules", "fsdp_requested", "fsdp_wrap_policy", "gather_with_grad", "is_distributed",
           "shard_bounds", "use_fsdp_wrap_policy"]


def is_distributed() -> bool:
    """``True`` when a ``torch.distributed`` process group with more than one process is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def fsdp_requested() -> bool:
    """``True`` when this process trains under FSDP (``accelerate launch`` with an FSDP config, or an
    ``Accelerator`` with an FSDP plugin), so loaders can adapt before FSDP wraps the model."""
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true", "yes"):
        return True
    try:
        from accelerate.state import AcceleratorState
    except ImportError:  # pragma: no cover - accelerate is a dependency
        return False
    kind = AcceleratorState._shared_state.get("distributed_type")
    return kind is not None and "FSDP" in str(kind)


def fsdp_wrap_policy(model: torch.nn.Module):
    """The FSDP1 auto-wrap policy for ``model``, or ``None`` when nothing should be a unit of its own:
    every transformer layer (the ``_no_split_modules`` of each Hugging Face model *inside* ``model``, which
    Accelerate's ``TRANSFORMER_BASED_WRAP`` misses in a ``SentenceTransformer``) and, with some parameters frozen
    (LoRA), every leaf with a trainable parameter, so frozen weights sharing its flat parameter get no gradients
    (PEFT's ``fsdp_auto_wrap_policy``). Reads the trainable set now: call it right before wrapping."""

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
    """The modules of ``model`` with ``called_outside_forward = True`` (a loss with a learnable
    temperature, called on gathered outputs). FSDP1 must leave them out (``ignored_modules``): a parameter read
    outside the wrapped forward is a view of the flat parameter; the loop averages their gradients itself."""
    return [m for m in model.modules() if getattr(m, "called_outside_forward", False)]


def use_fsdp_wrap_policy(accelerator, model: torch.nn.Module) -> bool:
    """Before ``accelerator`` wraps ``model`` with FSDP1, replace a default
    ``TRANSFORMER_BASED_WRAP`` (what ``recipes/accelerate/fsdp.yaml`` declares) by :func:`fsdp_wrap_policy`; a
    policy the user chose is kept, and ``ignored_modules`` become :func:`fsdp_outside_modules` unless named.
    ``True`` when the policy splits units off."""
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
    """Destroy the default process group, if any. Commands started by ``accelerate launch`` call
    this before returning: a process that leaves the group to interpreter shutdown can abort there and fail the
    whole launch."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def closes_process_group(command):
    """Decorate a command that may run under ``accelerate launch``: every process closes the process group when
    it returns or fails (:func:`close_process_group`)."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        finally:
            close_process_group()

    return run


def shard_bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    """``(start, stop)`` of process ``rank``'s contiguous, balanced shard of ``n`` items (earlier shards
    one larger, ``numpy.array_split``'s rule); shards in rank order are the items in order."""
    if n < 0 or not 0 <= rank < world:
        raise ValueError(f"need n >= 0 and rank in [0, world), got n={n}, rank={rank}, world={world}")
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def gather_with_grad(tensor: Tensor) -> Tensor:
    """All-gather ``tensor`` along dim 0 in rank order; the local slice *is* ``tensor`` (gradients
    flow into it), the others are detached copies. Shards may differ in size; identity with one process."""
    if not is_distributed():
        return tensor
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
    """Average the ``.grad`` of ``params`` over processes (what DDP does), in one flat all-reduce.
    A gradient missing on some processes counts as zeros there; one missing on *every* process stays ``None``, so
    AdamW skips that parameter as a single process would."""
    if not is_distributed():
        return
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
    """Copy ``params`` from process ``src`` to every process (what DDP does when it wraps a
    model), so replicas start identical."""
    if not is_distributed():
        return
    with torch.no_grad():
        for p in params:
            dist.broadcast(p.data, src=src)
