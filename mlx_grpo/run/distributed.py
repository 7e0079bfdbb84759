"""Data-parallel training over MLX's own distributed layer, `mx.distributed`.

Launched with `mlx.launch` (ring or MPI across Macs, JACCL over Thunderbolt),
every process (rank) runs the same `train()`:

- each rank samples and scores a contiguous share of the step's prompts
  (whole groups, so group baselines never straddle ranks), then the shares are
  gathered, so every rank holds the whole step: the same rewards, metrics and
  records as one process would have;
- the update's micro-batches are split between the ranks; each rank sums the
  gradients of its own, and `all_sum_tree` adds the ranks' sums before
  clipping. The loss of a micro-batch is already its share of the whole
  batch's loss (normalised by whole-batch counts), so the sum is the
  one-process gradient;
- rank 0 alone writes checkpoints, logs and the display.

Started without `mlx.launch` the group has one rank and every helper here is
a no-op, so the one-process path is the same code.
"""

from __future__ import annotations

import pickle

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

_group = None


def group():
    """The world group: `mx.distributed.init()` once (a group of one when not launched)."""
    global _group
    if _group is None:
        _group = mx.distributed.init()
    return _group


def rank() -> int:
    return group().rank()


def size() -> int:
    return group().size()


def is_main() -> bool:
    """True on the rank that writes files and talks to the user (rank 0)."""
    return rank() == 0


def shard(n: int, rank_: int | None = None, size_: int | None = None) -> range:
    """The contiguous share of `n` items that a rank takes; earlier ranks take one more when n is uneven.

    >>> [list(shard(5, r, 2)) for r in range(2)]
    [[0, 1, 2], [3, 4]]
    """
    r = rank() if rank_ is None else rank_
    k = size() if size_ is None else size_
    base, extra = divmod(n, k)
    start = r * base + min(r, extra)
    return range(start, start + base + (1 if r < extra else 0))


def all_sum_tree(tree):
    """Sum every array of a nested tree (a gradient) across ranks, one message per dtype."""
    if size() == 1:
        return tree
    flat = tree_flatten(tree)
    summed = {}
    for dtype in {v.dtype for _, v in flat}:
        items = [(k, v) for k, v in flat if v.dtype == dtype]
        buffer = mx.distributed.all_sum(mx.concatenate([v.reshape(-1) for _, v in items]))
        offsets = np.cumsum([0] + [v.size for _, v in items])
        for (k, v), lo, hi in zip(items, offsets[:-1], offsets[1:]):
            summed[k] = buffer[int(lo) : int(hi)].reshape(v.shape)
    return tree_unflatten([(k, summed[k]) for k, _ in flat])


def sum_across_ranks(values: dict[str, float]) -> dict[str, float]:
    """Add dicts of numbers across ranks; a key missing on a rank counts 0 there."""
    if size() == 1:
        return dict(values)
    out: dict[str, float] = {}
    for d in all_gather_objects(dict(values)):
        for k, v in d.items():
            out[k] = out.get(k, 0.0) + v
    return out


def all_gather_objects(obj) -> list:
    """A picklable object from every rank, in rank order (`[obj]` with one rank)."""
    if size() == 1:
        return [obj]
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    lengths = mx.distributed.all_gather(mx.array([len(data)], dtype=mx.int32)).tolist()
    padded = np.zeros(max(lengths), dtype=np.uint8)
    padded[: len(data)] = data
    gathered = np.array(mx.distributed.all_gather(mx.array(padded))).reshape(len(lengths), -1)
    return [pickle.loads(gathered[r, :n].tobytes()) for r, n in enumerate(lengths)]
