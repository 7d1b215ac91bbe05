"""Connected-component labelling, component sizes and the largest component.

``label_components`` reproduces ``scipy.ndimage.label`` exactly: foreground = non-zero,
4-connectivity (scipy's default cross structure) or 8-connectivity (3x3 square),
background 0, components numbered 1..n in raster (row-major) order of their first
pixel, ``n`` returned as a traced int32 scalar. Everything is jit- and vmap-safe
with static shapes.

Algorithm
---------
Each foreground pixel carries a provisional label: the flat row-major index of a
pixel of its own component, never larger than its own index. Labels start as the
index of the first pixel of the pixel's horizontal run. One round of a
``lax.while_loop`` does

1. a downward and an upward ``lax.scan`` over rows: a pixel takes the minimum of its
   label and the labels just computed for its neighbours in the previous row
   (vertical, plus the two diagonals for 8-connectivity), so a label travels any
   distance along a vertically monotone path in one sweep;
2. hooking: every pixel ``p`` named as a label by some pixels (the group of ``p``)
   receives, by a scatter-min, the smallest label reached by any member of its group,
   and every member then takes that value (in the first round the groups are the
   horizontal runs, so this is also the horizontal propagation);
3. pointer jumping ``label <- label[label]`` (a flat gather).

Steps 2-3 merge whole groups at once, as in union-find / Shiloach-Vishkin style
algorithms, so spirals, snakes and fractal noise converge in a handful of rounds
instead of one round per turn. The loop runs while some pair of adjacent foreground
pixels disagrees. Labels only decrease, are bounded below and stay inside the
component, so the loop always terminates; when neighbours agree, every pixel of a
component holds the same label, which is the index of a pixel of the component and
no larger than any of its pixels' indices: the component's first pixel in raster
order. The final numbering is the rank of that first pixel among all first pixels,
which is scipy's numbering. Under ``jax.vmap`` the batch is folded into one stack of
masks (``jax.custom_batching``), so the loop keeps a scalar predicate and the
gathers/scatters stay flat. Measured on 1024x1024 masks: 1-3 rounds for real object
masks and smooth blobs, 4-5 for thin winding bands, snakes and 50 % random noise.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["label_components", "component_sizes", "largest_component"]

_CONNECTIVITIES = (4, 8)


def _check(mask: jax.Array, connectivity: int) -> None:
    if mask.ndim != 2:
        raise ValueError(f"mask must be 2-D [H, W], got shape {mask.shape}; use jax.vmap for batches")
    if mask.shape[0] < 1 or mask.shape[1] < 1:
        raise ValueError(f"mask must be non-empty, got shape {mask.shape}")
    if mask.shape[0] * mask.shape[1] >= 2 ** 31 - 1:
        raise ValueError(f"mask has too many pixels for int32 labels: {mask.shape}")
    if connectivity not in _CONNECTIVITIES:
        raise ValueError(f"connectivity must be 4 or 8, got {connectivity}")


def _sweep(labels: jax.Array, fg: jax.Array, diagonal: bool, reverse: bool) -> jax.Array:
    """One pass over axis 0: each pixel takes the min with its already-swept neighbours.

    Args:
      labels: int32[H, ..., W] provisional labels (background pixels hold int32 max).
      fg: bool[H, ..., W] foreground.
      diagonal: also use the two diagonal neighbours (along the last axis) in the
        previous row.
      reverse: sweep from the last row to the first.
    Returns:
      int32[H, ..., W] labels after the sweep (background unchanged).
    """
    big = jnp.iinfo(jnp.int32).max

    def step(prev, row):
        lab, on = row
        best = jnp.minimum(lab, prev)
        if diagonal:
            edge = jnp.full(prev.shape[:-1] + (1,), big, prev.dtype)
            left = jnp.concatenate([edge, prev[..., :-1]], axis=-1)
            right = jnp.concatenate([prev[..., 1:], edge], axis=-1)
            best = jnp.minimum(best, jnp.minimum(left, right))
        new = jnp.where(on, best, big)
        return new, new

    start = jnp.full(labels.shape[1:], big, labels.dtype)
    _, out = lax.scan(step, start, (labels, fg), reverse=reverse)
    return out


def _scan_along_rows(op, values: jax.Array, identity: int) -> jax.Array:
    """Inclusive prefix ``op`` along the last axis (a ``lax.scan`` over columns; fastest on CPU).

    Args:
      op: associative binary function on int32 arrays.
      values: int32[..., W].
      identity: identity element of ``op``.
    Returns:
      int32[..., W] prefix results.
    """
    def step(acc, column):
        acc = op(acc, column)
        return acc, acc

    moved = jnp.moveaxis(values, -1, 0)
    start = jnp.full(moved.shape[1:], identity, values.dtype)
    return jnp.moveaxis(lax.scan(step, start, moved)[1], 0, -1)


def _neighbours_agree(labels: jax.Array, fg: jax.Array, diagonal: bool) -> jax.Array:
    """True iff every pair of adjacent foreground pixels carries the same label.

    Args:
      labels: int32[N, H, W]; fg: bool[N, H, W]; diagonal: also check corner neighbours.
    Returns:
      bool[] scalar (over the whole stack).
    """
    def same(a, b, fa, fb):
        return jnp.all((a == b) | ~(fa & fb))

    agree = same(labels[..., 1:], labels[..., :-1], fg[..., 1:], fg[..., :-1])
    agree &= same(labels[:, 1:], labels[:, :-1], fg[:, 1:], fg[:, :-1])
    if diagonal:
        agree &= same(labels[:, 1:, 1:], labels[:, :-1, :-1], fg[:, 1:, 1:], fg[:, :-1, :-1])
        agree &= same(labels[:, 1:, :-1], labels[:, :-1, 1:], fg[:, 1:, :-1], fg[:, :-1, 1:])
    return agree


def _root_labels(fg: jax.Array, connectivity: int) -> jax.Array:
    """Flat stack index of the first (raster-order) pixel of each pixel's component.

    Args:
      fg: bool[N, H, W] foreground of N masks (components never cross masks).
      connectivity: 4 or 8.
    Returns:
      int32[N, H, W]; background pixels hold int32 max.
    """
    big = jnp.iinfo(jnp.int32).max
    diagonal = connectivity == 8
    fg_flat = fg.reshape(-1)
    index = jnp.arange(fg.size, dtype=jnp.int32).reshape(fg.shape)
    left = jnp.pad(fg[..., :-1], ((0, 0), (0, 0), (1, 0)), constant_values=False)
    run_start = _scan_along_rows(jnp.maximum, jnp.where(fg & ~left, index, -1), -1)
    labels = jnp.where(fg, run_start, big)
    fg_rows_first = jnp.moveaxis(fg, 1, 0)

    def one_round(labels):
        old = jnp.where(fg_flat, labels.reshape(-1), 0)
        new = _sweep(jnp.moveaxis(labels, 1, 0), fg_rows_first, diagonal, reverse=False)
        new = _sweep(new, fg_rows_first, diagonal, reverse=True)
        new = jnp.moveaxis(new, 0, 1).reshape(-1)
        # Hooking: the pixel named by a pixel's old label learns the smallest label any
        # pixel naming it has reached; then every pixel takes its group's best. In the
        # first round the groups are the horizontal runs.
        best = new.at[old].min(jnp.where(fg_flat, new, big))
        new = jnp.minimum(new, best[old])
        # Pointer jumping: the pixel a label names has a label that is no larger.
        return jnp.where(fg_flat, new[jnp.where(fg_flat, new, 0)], big).reshape(fg.shape)

    # Do-while: the first round is always useful (it merges each run with its neighbours).
    labels = one_round(labels)
    return lax.while_loop(lambda lab: ~_neighbours_agree(lab, fg, diagonal), one_round, labels)


def _label_stack(fg: jax.Array, connectivity: int) -> tuple[jax.Array, jax.Array]:
    """``label_components`` for a stack: (int32[N, H, W], int32[N])."""
    if fg.size >= 2 ** 31 - 1:
        raise ValueError(f"stack of masks {fg.shape} (vmapped batch folded in) has too many pixels "
                         "for int32 labels; vmap over smaller batches")
    roots = _root_labels(fg, connectivity)
    index = jnp.arange(fg.size, dtype=jnp.int32).reshape(fg.shape)
    is_first = ((roots == index) & fg).astype(jnp.int32)
    # Row-major inclusive count of first pixels within each mask = final label.
    within_row = _scan_along_rows(jnp.add, is_first, 0)
    row_total = within_row[..., -1]
    row_offset = jnp.cumsum(row_total, axis=1) - row_total
    rank = within_row + row_offset[..., None]
    fg_flat = fg.reshape(-1)
    labels = jnp.where(fg_flat, rank.reshape(-1)[jnp.where(fg_flat, roots.reshape(-1), 0)], 0)
    return labels.reshape(fg.shape), rank[:, -1, -1]


@functools.lru_cache(maxsize=None)
def _stack_labeller(connectivity: int):
    """``_label_stack`` with a vmap rule folding vmapped axes into the stack (one scalar
    loop predicate and flat gathers/scatters instead of batched ones)."""
    @jax.custom_batching.custom_vmap
    def labeller(fg):
        return _label_stack(fg, connectivity)

    @labeller.def_vmap
    def _fold_batch(axis_size, in_batched, fg):
        (batched,) = in_batched
        if not batched:
            return labeller(fg), (False, False)
        labels, num = labeller(fg.reshape((-1,) + fg.shape[2:]))
        return (labels.reshape(fg.shape), num.reshape(fg.shape[:2])), (True, True)

    return labeller


def label_components(mask: jax.Array, connectivity: int = 4) -> tuple[jax.Array, jax.Array]:
    """Label the connected components of a binary mask exactly like ``scipy.ndimage.label``.

    Args:
      mask: [H, W] array of any dtype; non-zero = foreground.
      connectivity: static, 4 (edge neighbours; scipy's default structure) or 8
        (edge and corner neighbours; ``structure=np.ones((3, 3))``).
    Returns:
      (labels int32[H, W], num int32[]): 0 on background, 1..num on foreground,
      numbered in row-major order of each component's first pixel.
    """
    mask = jnp.asarray(mask)
    _check(mask, connectivity)
    labels, num = _stack_labeller(int(connectivity))((mask != 0)[None])
    return labels[0], num[0]


def component_sizes(labels: jax.Array, num_labels: int | None = None) -> jax.Array:
    """Pixel count of every label.

    Args:
      labels: int32[H, W] from ``label_components`` (0 = background).
      num_labels: static length minus one of the result; labels above it are dropped.
        Default ``H * W`` (an upper bound on the number of components).
    Returns:
      int32[num_labels + 1]; entry 0 counts background pixels, entry k the pixels of
      component k (0 for labels that do not occur).
    """
    labels = jnp.asarray(labels)
    if labels.ndim != 2:
        raise ValueError(f"labels must be 2-D [H, W], got shape {labels.shape}")
    if num_labels is None:
        num_labels = labels.shape[0] * labels.shape[1]
    if num_labels < 0:
        raise ValueError(f"num_labels must be >= 0, got {num_labels}")
    return jnp.zeros((num_labels + 1,), jnp.int32).at[labels.reshape(-1)].add(1, mode="drop")


def largest_component(mask: jax.Array, connectivity: int = 4) -> jax.Array:
    """Mask of the largest connected component.

    Ties are broken towards the lowest label, i.e. the component whose first pixel
    comes first in row-major order. An empty mask gives an empty result.

    Args:
      mask: [H, W] array of any dtype; non-zero = foreground.
      connectivity: static, 4 or 8 (see ``label_components``).
    Returns:
      bool[H, W], True on the pixels of the largest component.
    """
    labels, num = label_components(mask, connectivity)
    sizes = component_sizes(labels)
    best = jnp.argmax(sizes[1:]) + 1  # first maximum = lowest label
    return (labels == best) & (num > 0)
