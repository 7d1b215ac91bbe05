"""Exact Euclidean distance transforms (EDT), jit- and vmap-safe.

Every function here maps a mask ``[H, W]`` (non-zero = foreground) to, for every
foreground pixel, the distance (in pixels, pixel centres on the integer grid) to
the nearest zero pixel; zero pixels get 0. This is the definition of
``scipy.ndimage.distance_transform_edt`` and of OpenCV ``distanceTransform(DIST_L2,
maskSize=0)``. The integer *squared* distance is computed exactly in int32; the
float32 distance is ``sqrt`` of it (correctly rounded, so it equals scipy's float64
result rounded to float32 up to one ulp).

Conventions and degenerate inputs
---------------------------------
* An all-zero mask gives all zeros.
* A mask with **no zero pixel** has no defined distance (OpenCV returns ~1.8e19,
  scipy silently measures to a phantom zero at row -1, column 0). Here every pixel
  then gets the *squared image diagonal* ``H**2 + W**2`` (float: ``sqrt(H**2 + W**2)``),
  which is strictly larger than any attainable squared distance inside the image,
  so it acts as a finite cap (safe for products with a rendered disk and for
  gradients). ``distance_transform_edt(..., no_zero_value=...)`` overrides it (e.g.
  ``jnp.inf``). docs/protocols/tetris.md (§3.2 item 1, §8) calls for such
  a guard for the location-loss maps.
* ``pad_border=True`` zero-pads by one pixel on every side before the transform and
  crops afterwards, i.e. the image border counts as background. This is the map the
  RITM baseline clicker uses (docs/protocols/tetris.md §1 steps 2-3). It always has a zero pixel.

Two algorithms, one per kind of platform
----------------------------------------
``squared_distance_transform`` (and everything built on it) picks the algorithm by the
platform it is lowered for, in one place (``lax.platform_dependent``): the CPU
algorithm on the CPU, the accelerator algorithm on GPUs and other accelerators. Both
are exact and give the same int32 values; ``squared_distance_transform_cpu`` and
``squared_distance_transform_accelerator`` run one of them on any platform (tests and
experiments/benchmarks/bench_distance_components.py). docs/ARCHITECTURE.md (ops) says
why the platforms differ.

Both use separability: ``D(i, j) = min_j' (j - j')**2 + g(i, j')**2`` where ``g`` is
the 1-D distance to the nearest zero *within the column*.

CPU algorithm
~~~~~~~~~~~~~
Made for XLA:CPU, where a sequential loop step is cheap and gathers are not.

1. ``g`` is two ``lax.scan`` sweeps over rows (vectors of W lanes, O(HW)).
2. The row pass (a 1-D lower envelope of parabolas per row) is the hard part under
   XLA on CPU, where sequential per-row loops pay for every lane-iteration and
   gathers/scatters are expensive per element. Two exact methods are combined:

   a. *Windowed search*, per group of ``row_group`` rows (``lax.map`` keeps the
      working set in cache): ``D <- min(D, f[j +- d] + d**2)`` for d = 1, 2, ... in
      fused whole-group steps, stopping as soon as ``d**2 >= max(D)`` over the group
      (no farther column can improve any pixel: its value is at least ``d**2``).
      Exact; cost proportional to the largest distance in the group. Error regions,
      object masks and blobs of moderate size finish within ``window`` offsets.
   b. *Meijster, Roerdink & Hesselink (2000)* lower envelope for the rows that did not
      finish (e.g. "distance to a small far-away region", objects with an inradius
      above ``window``). The unfinished rows are packed to the front and processed in
      groups of ``envelope_group`` rows by one vectorised state machine (each
      iteration a row either pops its stack or consumes the next column, so at most
      ``2W`` iterations whatever the data); integer arithmetic throughout, the
      intersection ``Sep`` uses a float32 quotient with exact integer correction.
      Groups without unfinished rows, and the whole step when every row finished,
      are skipped by ``lax.cond``.

   Why the hybrid: Meijster alone (all rows) is bound by gathers; the windowed
   search alone is fast on error maps and object masks but O(W) per pixel on
   far-region maps; the hybrid keeps the former's speed and stays close to scipy
   on the latter. A lock-step variant of Meijster (all rows advance together, with
   an inner pop loop) was not faster than the state machine; brute force over all
   columns is O(H*W*W). Figures: docs/benchmarking.md, "Measurements behind design
   choices", "EDT row pass".

Accelerator algorithm
~~~~~~~~~~~~~~~~~~~~~
Made for GPUs, where every sequential loop iteration is a kernel launch of a few
hundred lanes and an XLA:GPU while loop copies its predicate to the host.

1. ``g`` from two parallel prefix scans (``lax.associative_scan``): the nearest zero
   above row i is the running maximum of the zero rows' indices, the nearest below
   the running minimum from the bottom. About ``2 log2 H`` wide array steps, no loop.
2. The row pass is the windowed search of the whole stack at once, with no fallback:
   each iteration applies ``offset_block`` (default ``DEFAULT_OFFSET_BLOCK``)
   consecutive offsets to every pixel in one fused element-wise step, and the loop
   stops once ``d**2 >= max(D)`` over the whole stack or ``d >= W``. The one
   ``while`` loop of the program therefore runs a handful of iterations on error
   regions and object masks and at most ``ceil((W - 1) / offset_block)`` on
   far-region maps (O(W) work per pixel there, but wide parallel work instead of
   Meijster's ``2W`` dependent steps). No gathers, scatters, per-row loops or
   ``lax.cond``.

Batches: ``jax.vmap`` of these functions is routed (``jax.custom_batching``) to the same
code with the batch folded into the stack, so loop predicates stay scalars (a plain
vmap of a while loop would select the whole loop state, tables included, every
iteration), unfinished rows of all masks are packed together on the CPU and the
accelerator row pass stops on the largest distance of the whole batch.

Limits: int32 arithmetic is exact while ``5 * max(H, W)**2 < 2**31`` (sides up to
20000 pixels); a ValueError is raised beyond that. Every candidate ``f + d**2`` of
either row pass has ``f <= (h + w)**2 <= 4 max(h, w)**2`` (a column without zeros) or
the padding value ``2**30``, and ``d <= max(h, w) + offset_block``, so with
``offset_block <= 1024`` it stays below ``2**31``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

__all__ = [
    "squared_distance_transform",
    "squared_distance_transform_cpu",
    "squared_distance_transform_accelerator",
    "distance_transform_edt",
    "no_zero_squared_distance",
    "DEFAULT_WINDOW",
    "DEFAULT_ROW_GROUP",
    "DEFAULT_ENVELOPE_GROUP",
    "DEFAULT_OFFSET_BLOCK",
]

# Offsets tried by the windowed search before a row group falls back to Meijster.
DEFAULT_WINDOW = 64
# Rows processed together by the windowed search (cache-sized working set).
DEFAULT_ROW_GROUP = 128
# Rows processed together by the Meijster fallback (vector width of its state machine).
DEFAULT_ENVELOPE_GROUP = 256
# Offsets per windowed-search iteration (one fused XLA loop body).
_UNROLL = 4
# Column offsets per iteration of the accelerator row pass (one fused element-wise step).
DEFAULT_OFFSET_BLOCK = 64
_MAX_OFFSET_BLOCK = 1024

_MAX_SIDE = 20000

_GATHER_DIMS = lax.GatherDimensionNumbers(
    offset_dims=(1,), collapsed_slice_dims=(0, 1), start_index_map=(0, 1))
_SCATTER_DIMS = lax.ScatterDimensionNumbers(
    update_window_dims=(1,), inserted_window_dims=(0, 1), scatter_dims_to_operand_dims=(0, 1))
_IN_BOUNDS = lax.GatherScatterMode.PROMISE_IN_BOUNDS


def no_zero_squared_distance(height: int, width: int) -> int:
    """Squared distance reported when a mask has no zero pixel: ``H**2 + W**2``.

    Args:
      height, width: static image size in pixels.
    Returns:
      Python int, the squared image diagonal (larger than any in-image squared distance).
    """
    return int(height) ** 2 + int(width) ** 2


def _check_mask(mask: jax.Array, name: str = "mask") -> None:
    if mask.ndim != 2:
        raise ValueError(f"{name} must be 2-D [H, W], got shape {mask.shape}; use jax.vmap for batches")
    h, w = mask.shape
    if h < 1 or w < 1:
        raise ValueError(f"{name} must be non-empty, got shape {mask.shape}")
    if max(h, w) + 2 > _MAX_SIDE:
        raise ValueError(f"{name} side {max(h, w)} exceeds the exact int32 range ({_MAX_SIDE - 2} pixels)")


def _column_distance(zero: jax.Array, cap: int) -> jax.Array:
    """1-D distance along axis 0 to the nearest zero pixel of the same column.

    Args:
      zero: bool[H, ...], True where the mask is zero.
      cap: value for columns without any zero (any value > every real distance).
    Returns:
      int32[H, ...], ``min(|i - i'|, cap)`` over zero pixels (i', ...) of each column.
    """
    def sweep(dist, zero_row):
        dist = jnp.minimum(jnp.where(zero_row, 0, dist + 1), cap)
        return dist, dist

    start = jnp.full(zero.shape[1:], cap, jnp.int32)
    _, down = lax.scan(sweep, start, zero)
    _, up = lax.scan(sweep, start, zero, reverse=True)
    return jnp.minimum(down, up)


def _floor_div_exact(num: jax.Array, den: jax.Array, bound: int) -> jax.Array:
    """floor(num / den) for int32 num, den > 0, exact whenever the result lies in [-bound, bound].

    Outside that range the result is clipped to at most ``bound + 2`` in magnitude and keeps
    its side (callers only compare it against the row length). A float32 quotient is
    within one of the true value for ``|num / den| <= bound < 2**22``; two integer steps
    correct it. Products stay below ``(bound + 3) * den`` (no int32 overflow).
    """
    q = jnp.floor(num.astype(jnp.float32) / den.astype(jnp.float32))
    q = jnp.clip(q, -(bound + 2), bound + 1).astype(jnp.int32)
    q = jnp.where(q * den > num, q - 1, q)
    q = jnp.where((q + 1) * den <= num, q + 1, q)
    return q


def _windowed_row_pass(f: jax.Array, window: int) -> tuple[jax.Array, jax.Array]:
    """Exact row pass restricted to column offsets ``|d| < d_end``, with early stop.

    Args:
      f: int32[G, W] squared column distances of a group of rows.
      window: static maximum number of offsets to try.
    Returns:
      (D int32[G, W], converged bool[G]): D is the exact squared distance for rows
      marked converged (``d_end**2 >= max_j D``); other rows still need the envelope.
    """
    rows, width = f.shape
    n_iter = max(1, -(-window // _UNROLL))
    pad = n_iter * _UNROLL + 1
    far = jnp.int32(2 ** 30)  # + d**2 stays below 2**31 for d <= pad
    padded = jnp.pad(f, ((0, 0), (pad, pad)), constant_values=far)

    def keep_going(carry):
        offset, dist = carry
        return (offset * offset < jnp.max(dist)) & (offset < 1 + n_iter * _UNROLL)

    def step(carry):
        offset, dist = carry
        for k in range(_UNROLL):
            d = offset + k
            right = lax.dynamic_slice_in_dim(padded, pad + d, width, axis=1)
            left = lax.dynamic_slice_in_dim(padded, pad - d, width, axis=1)
            dist = jnp.minimum(dist, jnp.minimum(left, right) + d * d)
        return offset + _UNROLL, dist

    offset, dist = lax.while_loop(keep_going, step, (jnp.int32(1), f))
    converged = offset * offset >= jnp.max(dist, axis=1)
    return dist, converged


def _meijster_row_pass(f: jax.Array, active: jax.Array) -> jax.Array:
    """Exact 1-D lower envelope ``min_j' (j - j')**2 + f[i, j']`` for the active rows.

    Meijster, Roerdink & Hesselink (2000), second phase, vectorised over rows as a
    state machine: each iteration an active row either pops its stack (the new column
    beats the top parabola where the top starts) or consumes the next column (push
    if it wins somewhere). Inactive rows do nothing and return zeros.

    Args:
      f: int32[G, W] squared column distances.
      active: bool[G] rows to process.
    Returns:
      int32[G, W] squared distances for active rows (0 for inactive rows).
    """
    rows, width = f.shape
    lanes = jnp.arange(rows, dtype=jnp.int32)
    # Per row: stack entries [site s, start t, f(s), unused] plus f of every column in
    # slot 3, so one gather serves both a pop (read entry q-1) and an advance (read
    # f of the next column). Row `width` is a write sink for rows that do not push.
    table = jnp.zeros((rows, width + 1, 4), jnp.int32)
    table = table.at[:, :width, 3].set(f)
    table = table.at[:, 0, 2].set(f[:, 0])

    def gather(tab, index):
        return lax.gather(tab, jnp.stack([lanes, index], axis=1), _GATHER_DIMS, (1, 1, 4),
                          mode=_IN_BOUNDS)

    def scatter(tab, index, values):
        return lax.scatter(tab, jnp.stack([lanes, index], axis=1), values, _SCATTER_DIMS,
                           mode=_IN_BOUNDS, indices_are_sorted=True, unique_indices=True)

    zeros = jnp.zeros((rows,), jnp.int32)
    column = jnp.where(active, 1, width).astype(jnp.int32)
    f_next = f[:, min(1, width - 1)]

    def pending(state):
        return jnp.any(state[0] < width)

    def advance(state):
        u, q, s, t, fs, fu, tab = state
        live = u < width
        nonempty = q >= 0
        # Pop when column u is strictly better than the top site s at the top's start t.
        pop = live & nonempty & (fs - fu > (s - u) * (2 * t - s - u))
        consume = live & ~pop
        # First position where u is strictly better than s (Meijster's Sep + 1).
        start = 1 + _floor_div_exact(u * u - s * s + fu - fs, jnp.maximum(2 * (u - s), 1), width)
        push_first = consume & ~nonempty
        push_next = consume & nonempty & (start < width)
        push = push_first | push_next
        new_q = jnp.where(pop, q - 1, jnp.where(push, q + 1, q))
        new_t = jnp.where(push_first, 0, start)
        pop, push, consume, new_q, new_t = lax.optimization_barrier((pop, push, consume, new_q, new_t))
        tab = scatter(tab, jnp.where(push, new_q, width), jnp.stack([u, new_t, fu], axis=1))
        # Read after the write: no aliasing copy of the table inside the loop.
        got = gather(tab, jnp.where(pop, jnp.maximum(q - 1, 0), jnp.minimum(u + 1, width - 1)))
        s = jnp.where(pop, got[:, 0], jnp.where(push, u, s))
        t = jnp.where(pop, got[:, 1], jnp.where(push, new_t, t))
        fs = jnp.where(pop, got[:, 2], jnp.where(push, fu, fs))
        fu = jnp.where(consume, got[:, 3], fu)
        u = jnp.where(consume, u + 1, u)
        return u, new_q, s, t, fs, fu, tab

    state = (column, zeros, zeros, zeros, f[:, 0], f_next, table)
    _, top, _, _, _, _, table = lax.while_loop(pending, advance, state)

    # Query: entry k covers columns [t_k, t_{k+1}). Scatter (s_k, s_k**2 + f(s_k)) to
    # column t_k of its row, forward-fill along the row, then
    # D = x**2 - 2 x s + (s**2 + f(s)).
    entries = table[:, :width, :]
    kept = jnp.arange(width, dtype=jnp.int32)[None, :] <= top[:, None]
    start_col = jnp.where(kept, entries[:, :, 1], width)            # width = dropped
    lane_ix = jnp.broadcast_to(lanes[:, None], (rows, width))
    site = entries[:, :, 0]
    offset = site * site + entries[:, :, 2]
    marks = jnp.full((width + 1, rows, 2), -1, jnp.int32)
    marks = marks.at[start_col, lane_ix].set(jnp.stack([site, offset], axis=-1),
                                             unique_indices=True, mode="promise_in_bounds")

    def fill(carry, xs):
        s_cur, c_cur = carry
        mark, x = xs
        new = mark[:, 0] >= 0
        s_cur = jnp.where(new, mark[:, 0], s_cur)
        c_cur = jnp.where(new, mark[:, 1], c_cur)
        return (s_cur, c_cur), x * x - 2 * x * s_cur + c_cur

    _, out_t = lax.scan(fill, (zeros, zeros), (marks[:width], jnp.arange(width, dtype=jnp.int32)))
    return jnp.where(active[:, None], out_t.T, 0)


def _meijster_if_needed(f: jax.Array, active: jax.Array) -> jax.Array:
    """``_meijster_row_pass`` skipped (zeros) when no row is active (a select under vmap)."""
    return lax.cond(jnp.any(active), _meijster_row_pass, lambda f, a: jnp.zeros_like(f), f, active)


def _row_pass(f: jax.Array, window: int, row_group: int, envelope_group: int) -> jax.Array:
    """Exact ``min_j' (j - j')**2 + f[i, j']`` for every row (hybrid, see module doc).

    Rows whose windowed search does not converge are packed to the front (stable
    order) and handed to Meijster's envelope in groups of ``envelope_group`` rows;
    groups without such rows cost nothing.
    """
    height, width = f.shape
    group = max(1, min(row_group, height))
    n_groups = -(-height // group)
    f_groups = jnp.pad(f, ((0, n_groups * group - height), (0, 0))).reshape(n_groups, group, width)

    if window > 0:
        dist, converged = lax.map(lambda fg: _windowed_row_pass(fg, window), f_groups)
        dist = dist.reshape(n_groups * group, width)[:height]
        converged = converged.reshape(n_groups * group)[:height]
    else:
        dist, converged = f, jnp.zeros((height,), bool)

    chunk = max(1, min(envelope_group, height))
    n_chunks = -(-height // chunk)

    def envelope_for_open_rows(dist):
        order = jnp.argsort(converged, stable=True)  # unconverged rows first
        n_open = jnp.sum(~converged)
        packed = jnp.pad(f[order], ((0, n_chunks * chunk - height), (0, 0)))
        slots = jnp.arange(n_chunks * chunk, dtype=jnp.int32).reshape(n_chunks, chunk)
        exact = lax.map(lambda args: _meijster_if_needed(args[0], args[1] < n_open),
                        (packed.reshape(n_chunks, chunk, width), slots))
        exact = exact.reshape(n_chunks * chunk, width)[:height]
        unpacked = jnp.zeros_like(exact).at[order].set(exact, unique_indices=True)
        return jnp.where(converged[:, None], dist, unpacked)

    # Scalar predicate (the stack transform folds vmap axes, see _stack_transform).
    return lax.cond(jnp.all(converged), lambda d: d, envelope_for_open_rows, dist)


def _accelerator_column_distance(zero: jax.Array, cap: int) -> jax.Array:
    """``_column_distance`` as two parallel prefix scans instead of row-by-row sweeps.

    The nearest zero above row i is ``max{i' <= i : zero[i']}`` (a running maximum of the
    zero rows' indices), the nearest zero below a running minimum from the bottom; both
    are ``lax.associative_scan`` (about ``2 log2 H`` wide array steps, no loop).

    Args:
      zero: bool[N, H, W], True where the mask is zero (axis 1 is the column axis).
      cap: value for columns without any zero (any value > every real distance).
    Returns:
      int32[N, H, W], ``min(|i - i'|, cap)`` over zero pixels (n, i', j) of each column.
    """
    height = zero.shape[1]
    rows = lax.broadcasted_iota(jnp.int32, zero.shape, 1)
    # Sentinels at distance >= cap from every row, so "no zero on that side" gives cap.
    above = lax.associative_scan(jnp.maximum, jnp.where(zero, rows, -cap), axis=1)
    below = lax.associative_scan(jnp.minimum, jnp.where(zero, rows, height - 1 + cap), axis=1, reverse=True)
    return jnp.minimum(jnp.minimum(rows - above, below - rows), cap)


def _brute_force_row_pass(f: jax.Array, offset_block: int) -> jax.Array:
    """Exact ``min_j' (j - j')**2 + f[i, j']`` by trying column offsets in wide blocks.

    Each loop iteration applies ``D <- min(D, min(f[j - d], f[j + d]) + d**2)`` for
    ``offset_block`` consecutive offsets d to every pixel of the stack (one fused
    element-wise step); the loop stops once ``d**2 >= max(D)`` over the whole stack
    (no farther column can improve any pixel) or no column is left (``d >= W``), so it
    runs at most ``ceil((W - 1) / offset_block)`` iterations.

    Args:
      f: int32[R, W] squared column distances (every row of every mask of the stack).
      offset_block: static offsets per iteration.
    Returns:
      int32[R, W] squared distances in pixels**2.
    """
    width = f.shape[1]
    n_blocks = -(-(width - 1) // offset_block)
    if n_blocks == 0:
        return f
    pad = n_blocks * offset_block
    far = jnp.int32(2 ** 30)  # + d**2 stays below 2**31 for d <= pad (see _check_offset_block)
    padded = jnp.pad(f, ((0, 0), (pad, pad)), constant_values=far)

    def keep_going(carry):
        offset, dist = carry
        return (offset < width) & (offset * offset < jnp.max(dist))

    def block(carry):
        offset, dist = carry
        # Two dynamic windows per iteration, static slices of them per offset (one fusion).
        span = width + offset_block - 1
        left = lax.dynamic_slice_in_dim(padded, pad - offset - (offset_block - 1), span, axis=1)
        right = lax.dynamic_slice_in_dim(padded, pad + offset, span, axis=1)
        for k in range(offset_block):
            d = offset + k
            start = offset_block - 1 - k  # left[:, start + j] = f[j - d]; right[:, k + j] = f[j + d]
            nearer = jnp.minimum(left[:, start:start + width], right[:, k:k + width])
            dist = jnp.minimum(dist, nearer + d * d)
        return offset + offset_block, dist

    _, dist = lax.while_loop(keep_going, block, (jnp.int32(1), f))
    return dist


def _edt_frame(foreground: jax.Array, pad_border: bool, transform_zero) -> jax.Array:
    """The border padding and the no-zero cap around one squared-EDT algorithm.

    Args:
      foreground: bool[N, H, W].
      pad_border: see ``squared_distance_transform``.
      transform_zero: ``(zero bool[N, h, w], cap) -> int32[N, h, w]``, the squared EDT of
        the (padded) masks, ``cap = h + w`` standing for "no zero in this column".
    Returns:
      int32[N, H, W].
    """
    count, height, width = foreground.shape
    if pad_border:
        foreground = jnp.pad(foreground, ((0, 0), (1, 1), (1, 1)), constant_values=False)
    ph, pw = foreground.shape[1:]
    zero = ~foreground
    cap = ph + pw  # larger than any in-image distance; columns without zeros
    dist = transform_zero(zero, cap)
    if pad_border:
        return dist[:, 1:-1, 1:-1]
    has_zero = jnp.any(zero, axis=(1, 2))
    return jnp.where(has_zero[:, None, None], dist, no_zero_squared_distance(height, width))


def _squared_edt_stack(foreground: jax.Array, pad_border: bool, window: int, row_group: int,
                       envelope_group: int) -> jax.Array:
    """Squared EDT of a stack of masks, CPU algorithm: all rows of all masks processed together.

    Args:
      foreground: bool[N, H, W].
      pad_border, window, row_group, envelope_group: see ``squared_distance_transform``.
    Returns:
      int32[N, H, W].
    """
    def transform_zero(zero, cap):
        count, ph, pw = zero.shape
        g = jnp.moveaxis(_column_distance(jnp.moveaxis(zero, 1, 0), cap), 0, 1)
        dist = _row_pass((g * g).reshape(count * ph, pw), window, row_group, envelope_group)
        return dist.reshape(count, ph, pw)

    return _edt_frame(foreground, pad_border, transform_zero)


def _accelerator_edt_stack(foreground: jax.Array, pad_border: bool, offset_block: int) -> jax.Array:
    """Squared EDT of a stack of masks, accelerator algorithm (prefix-scan columns, brute-force rows).

    Args:
      foreground: bool[N, H, W].
      pad_border, offset_block: see ``squared_distance_transform_accelerator``.
    Returns:
      int32[N, H, W].
    """
    def transform_zero(zero, cap):
        count, ph, pw = zero.shape
        g = _accelerator_column_distance(zero, cap)
        return _brute_force_row_pass((g * g).reshape(count * ph, pw), offset_block).reshape(count, ph, pw)

    return _edt_frame(foreground, pad_border, transform_zero)


def _per_platform_edt_stack(foreground: jax.Array, pad_border: bool, window: int, row_group: int,
                            envelope_group: int) -> jax.Array:
    """The CPU algorithm on the CPU, the accelerator algorithm everywhere else (decided at lowering)."""
    return lax.platform_dependent(
        foreground,
        cpu=functools.partial(_squared_edt_stack, pad_border=pad_border, window=window, row_group=row_group,
                              envelope_group=envelope_group),
        default=functools.partial(_accelerator_edt_stack, pad_border=pad_border,
                                  offset_block=DEFAULT_OFFSET_BLOCK))


@functools.lru_cache(maxsize=None)
def _stack_transform(stack_edt, settings: tuple):
    """``stack_edt(foreground, *settings)`` with a vmap rule that folds vmapped axes into the stack.

    Under plain ``jax.vmap`` the while loops would get batched predicates, and JAX then
    selects the whole loop state (including the envelope tables) every iteration;
    folding the batch into the stack keeps one scalar predicate, lets the CPU envelope
    fallback pack the unfinished rows of all masks together and lets the accelerator
    row pass stop on the maximum of the whole batch.

    Args:
      stack_edt: one of the module's ``bool[N, H, W] -> int32[N, H, W]`` stack functions.
      settings: its static arguments after ``foreground``.
    """
    @jax.custom_batching.custom_vmap
    def transform(foreground):
        return stack_edt(foreground, *settings)

    @transform.def_vmap
    def _fold_batch(axis_size, in_batched, foreground):
        (batched,) = in_batched
        if not batched:
            return transform(foreground), False
        flat = foreground.reshape((-1,) + foreground.shape[2:])
        return transform(flat).reshape(foreground.shape), True

    return transform


def _one_mask(stack_edt, mask: jax.Array, settings: tuple) -> jax.Array:
    """``stack_edt`` (through `_stack_transform`, so vmap folds) of one checked ``[H, W]`` mask -> int32[H, W]."""
    mask = jnp.asarray(mask)
    _check_mask(mask)
    return _stack_transform(stack_edt, settings)((mask != 0)[None])[0]


def _check_cpu_settings(window: int, row_group: int, envelope_group: int) -> None:
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    if row_group < 1 or envelope_group < 1:
        raise ValueError(f"row_group and envelope_group must be >= 1, got {row_group}, {envelope_group}")


def _check_offset_block(offset_block: int) -> None:
    # far (2**30) and any f <= (2 * _MAX_SIDE)**2 plus d**2 with d <= _MAX_SIDE + offset_block stay < 2**31.
    if not 1 <= offset_block <= _MAX_OFFSET_BLOCK:
        raise ValueError(f"offset_block must be in [1, {_MAX_OFFSET_BLOCK}], got {offset_block}")


def squared_distance_transform(mask: jax.Array, *, pad_border: bool = False,
                               window: int = DEFAULT_WINDOW,
                               row_group: int = DEFAULT_ROW_GROUP,
                               envelope_group: int = DEFAULT_ENVELOPE_GROUP) -> jax.Array:
    """Exact squared Euclidean distance from every pixel to the nearest zero pixel.

    The algorithm is chosen by the platform the program is lowered for (module doc):
    ``squared_distance_transform_cpu`` on the CPU, ``squared_distance_transform_accelerator``
    (with ``DEFAULT_OFFSET_BLOCK``) on GPUs and other accelerators; the values are the same.

    Args:
      mask: [H, W] array of any dtype; non-zero = foreground (gets a distance),
        zero = background (gets 0).
      pad_border: if True, zero-pad by one pixel on every side, transform, crop back
        (the image border counts as background; RITM clicker convention).
      window: static; offsets tried by the CPU windowed search (rounded up to a multiple
        of 4) before falling back to Meijster's envelope (0 = always Meijster).
        Affects speed only, never values.
      row_group, envelope_group: static; rows processed together by the CPU windowed
        search and by the envelope fallback. Affect speed only.
    Returns:
      int32[H, W] squared distances in pixels**2. If the (padded) mask has no zero
      pixel, every value is ``H**2 + W**2`` (see module doc).
    """
    _check_cpu_settings(window, row_group, envelope_group)
    return _one_mask(_per_platform_edt_stack, mask, (bool(pad_border), int(window), int(row_group),
                                                     int(envelope_group)))


def squared_distance_transform_cpu(mask: jax.Array, *, pad_border: bool = False,
                                   window: int = DEFAULT_WINDOW,
                                   row_group: int = DEFAULT_ROW_GROUP,
                                   envelope_group: int = DEFAULT_ENVELOPE_GROUP) -> jax.Array:
    """``squared_distance_transform`` with the CPU algorithm on any platform (same arguments).

    Windowed search plus Meijster's envelope (module doc); for tests and benchmarks.
    """
    _check_cpu_settings(window, row_group, envelope_group)
    return _one_mask(_squared_edt_stack, mask, (bool(pad_border), int(window), int(row_group), int(envelope_group)))


def squared_distance_transform_accelerator(mask: jax.Array, *, pad_border: bool = False,
                                           offset_block: int = DEFAULT_OFFSET_BLOCK) -> jax.Array:
    """``squared_distance_transform`` with the accelerator algorithm on any platform.

    Prefix-scan column pass and blocked brute-force row pass (module doc); what
    ``squared_distance_transform`` runs on a GPU, callable on the CPU for tests and benchmarks.

    Args:
      mask: [H, W] array of any dtype; non-zero = foreground.
      pad_border: zero-pad by one pixel (border counts as background), then crop.
      offset_block: static; column offsets per row-pass iteration (1 to 1024). Affects
        speed only, never values.
    Returns:
      int32[H, W] squared distances in pixels**2 (``H**2 + W**2`` everywhere without a zero).
    """
    _check_offset_block(offset_block)
    return _one_mask(_accelerator_edt_stack, mask, (bool(pad_border), int(offset_block)))


def distance_transform_edt(mask: jax.Array, *, pad_border: bool = False,
                           no_zero_value: float | None = None,
                           window: int = DEFAULT_WINDOW,
                           row_group: int = DEFAULT_ROW_GROUP,
                           envelope_group: int = DEFAULT_ENVELOPE_GROUP) -> jax.Array:
    """Exact Euclidean distance transform (scipy ``distance_transform_edt`` semantics).

    Args:
      mask: [H, W] array of any dtype; non-zero = foreground.
      pad_border: zero-pad by one pixel (border counts as background), then crop.
      no_zero_value: value for every pixel when the mask has no zero pixel; default
        ``sqrt(H**2 + W**2)`` (the image diagonal). Ignored with ``pad_border``.
      window, row_group, envelope_group: static speed knobs, see
        ``squared_distance_transform``.
    Returns:
      float32[H, W] distances in pixels; ``sqrt`` of the exact int32 squared distance.
    """
    mask = jnp.asarray(mask)
    squared = squared_distance_transform(mask, pad_border=pad_border, window=window,
                                         row_group=row_group, envelope_group=envelope_group)
    dist = jnp.sqrt(squared.astype(jnp.float32))
    if no_zero_value is not None and not pad_border:
        dist = jnp.where(jnp.any(mask == 0), dist, jnp.float32(no_zero_value))
    return dist

