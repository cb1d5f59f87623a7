"""Data-parallel helpers for medadapt's own contrastive training loops (head trainer, CARE stages).

Why: InfoNCE-style losses use the *other* documents of the batch as negatives. Under data parallelism
(``accelerate launch --num_processes N``) each process only embeds its shard of the global batch; a loss
computed on the shard alone sees ``B / N`` in-batch negatives instead of ``B``, i.e. a different (easier)
objective than the single-process run with the same global batch. To train the same objective, every
process all-gathers the embeddings of the whole global batch before the loss.

How (hand-written; ``torch.distributed.all_gather`` carries no gradient, and
``torch.distributed.nn.functional.all_gather`` needs equal shard sizes and a collective in backward):

1. :func:`shard_bounds` splits each global batch into contiguous, balanced shards, so that concatenating the
   shards in rank order gives back the global batch in its single-process order.
2. :func:`gather_with_grad` all-gathers a tensor along dim 0 (shards may differ in size) and puts the local,
   gradient-carrying tensor back in place of its detached copy: gradients flow into this process's own
   embeddings only.
3. Every process then computes the **global** loss (all queries of the global batch against all candidates)
   on the gathered tensors: the same number on every process, equal to the single-process loss.
4. Backward of that loss gives, on process ``r``, the gradient of the global loss through ``r``'s own
   embeddings; the full gradient is the **sum** over processes. DDP (and DeepSpeed) *average* gradients,
   so the loss is multiplied by :func:`gradient_scale` (``N``) before backward: ``mean_r(N * g_r) = sum_r
   g_r``. Loops that do not wrap the model in DDP (the head trainer) call :func:`average_gradients` after
   backward, with the same scaling. Loss values are logged unscaled.

:func:`global_positive_indices` gives, for a process that keeps its queries local and gathers only the
candidates (the cheaper "local queries x global candidates" variant), where each local query's positive
sits in the gathered candidate tensor; the loss per process is then a mean over local queries and must be
weighted by ``N * B_r / B`` to average to the global loss (see its docstring). With one process (or no
``torch.distributed`` process group) every helper is the identity / a no-op.

Example:
    >>> start, stop = shard_bounds(len(batch), rank, world)
    >>> q = gather_with_grad(model(queries[start:stop]))          # (B, d), grad on rows start:stop
    >>> loss = infonce(q, gather_with_grad(model(positives[start:stop])))["infonce"]
    >>> (gradient_scale() * loss).backward()                     # DDP averages -> single-process grad
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

__all__ = [
    "average_gradients",
    "broadcast_parameters",
    "gather_with_grad",
    "global_positive_indices",
    "gradient_scale",
    "is_distributed",
    "rank_and_world",
    "shard_bounds",
    "shard_sizes",
    "sum_across_processes",
]


def is_distributed() -> bool:
    """``True`` when a ``torch.distributed`` process group with more than one process is running."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank_and_world() -> tuple[int, int]:
    """``(rank, world_size)`` of the running process group, ``(0, 1)`` without one."""
    import torch.distributed as dist

    if not is_distributed():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def shard_sizes(n: int, world: int) -> list[int]:
    """Sizes of the ``world`` contiguous shards of ``n`` items: balanced, earlier shards one larger
    (``numpy.array_split`` rule), e.g. ``shard_sizes(10, 4) == [3, 3, 2, 2]``."""
    if n < 0 or world < 1:
        raise ValueError(f"need n >= 0 and world >= 1, got n={n}, world={world}")
    base, extra = divmod(n, world)
    return [base + (r < extra) for r in range(world)]


def shard_bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    """``(start, stop)`` of process ``rank``'s contiguous shard of ``n`` items (see :func:`shard_sizes`).
    Shards concatenated in rank order are the items in their original order."""
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    sizes = shard_sizes(n, world)
    start = sum(sizes[:rank])
    return start, start + sizes[rank]


def gradient_scale() -> float:
    """Factor to multiply a loss computed identically on every process (on gathered tensors) by before
    backward, so that averaging gradients over processes (DDP, :func:`average_gradients`) yields the
    single-process gradient: the number of processes (1.0 without a process group)."""
    return float(rank_and_world()[1])


def gather_with_grad(tensor: Tensor, sizes: Sequence[int] | None = None) -> Tensor:
    """All-gather ``tensor`` along dim 0 from every process, in rank order; the local slice *is* ``tensor``
    (gradients flow into it), the other processes' slices are detached copies.

    Shards may differ in size along dim 0 (they are padded for the collective and cut back). Pass
    ``sizes`` (every process's dim-0 size, e.g. from :func:`shard_sizes`) when known, to save one
    collective. Boolean tensors are supported (sent as ``uint8``). Identity with one process.
    """
    if not is_distributed():
        return tensor
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    if sizes is None:
        local = torch.tensor([tensor.shape[0]], dtype=torch.long, device=tensor.device)
        every = [torch.zeros_like(local) for _ in range(world)]
        dist.all_gather(every, local)
        sizes = [int(s) for s in every]
    sizes = [int(s) for s in sizes]
    if len(sizes) != world or sizes[rank] != tensor.shape[0]:
        raise ValueError(f"sizes {sizes} do not match {world} processes / local size {tensor.shape[0]}")
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


def global_positive_indices(local_size: int, sizes: Sequence[int] | None = None, *,
                            device: torch.device | str | None = None) -> Tensor:
    """Indices of this process's ``local_size`` queries' positives in a candidate tensor whose leading
    rows are the positives gathered with :func:`gather_with_grad` (query ``i`` of rank ``r`` -> row
    ``offset_r + i``, ``offset_r`` = number of rows of the lower ranks). ``arange(local_size)`` with one
    process.

    For the "local queries x global candidates" variant: the per-process loss is then a mean over local
    queries; weight it by ``N * B_r / B`` (``N`` processes, ``B_r`` local and ``B`` global queries) before
    backward and sum those weighted values (divided by ``N``) for logging. That variant only matches the
    single-process gradient when the gather's backward sums the candidate gradients of every process
    (``torch.distributed.nn.functional.all_gather``); medadapt's loops instead gather queries too and
    compute the global loss everywhere (module docstring).
    """
    rank, world = rank_and_world()
    if sizes is None:
        if world == 1:
            sizes = [local_size]
        else:
            import torch.distributed as dist

            local = torch.tensor([local_size], dtype=torch.long)
            every = [torch.zeros_like(local) for _ in range(world)]
            dist.all_gather(every, local)
            sizes = [int(s) for s in every]
    if len(sizes) != world or sizes[rank] != local_size:
        raise ValueError(f"sizes {list(sizes)} do not match {world} processes / local size {local_size}")
    offset = sum(int(s) for s in sizes[:rank])
    return torch.arange(offset, offset + local_size, device=device)


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


def sum_across_processes(tensor: Tensor) -> Tensor:
    """Element-wise sum of ``tensor`` over processes (a new tensor; ``tensor`` itself is unchanged)."""
    out = tensor.detach().clone()
    if is_distributed():
        import torch.distributed as dist

        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out
