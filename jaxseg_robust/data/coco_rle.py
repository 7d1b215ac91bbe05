"""COCO run-length encoding: reading the compressed string, and decoding runs straight into packed bits (host).

Follows docs/protocols/boundary_ap_pq.md ("RLE"). A COCO RLE lists, in
column-major pixel order, alternating background / foreground run lengths
(the first run is background). The compressed form writes each run as a
little-endian sequence of 5-bit groups (characters 48..111; bit 0x20 = more
groups follow, bit 0x10 of the last group = negative), and run ``i >= 3`` as
the difference to run ``i - 2`` (pycocotools' ``rleToString``/``rleFrString``).

Decoding is vectorised NumPy that writes the ``uint32`` words of the packed
layout the device programs use (32 rows of a column per word) without ever
forming the byte-per-pixel mask: every run boundary toggles the bits from its
position to the end of its word, and the state entering each word is the
parity of the boundaries before it. That costs O(runs + words) per mask, well
below ``pycocotools.mask.decode`` followed by bit packing (docs/benchmarking.md,
"Measurements behind design choices").
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

WORD_BITS = 32
_ALL = np.uint64(0xFFFFFFFF)


CHUNK_CHARS = 1 << 17  # characters per vectorised pass: its arrays stay in the CPU caches


def strings_runs_flat(strings: list) -> tuple[np.ndarray, np.ndarray]:
    """The run lengths of many compressed RLE strings (str or bytes), concatenated.

    Vectorised passes over the concatenated characters of chunks of about
    ``CHUNK_CHARS`` characters (a per-string loop costs tens of microseconds
    of NumPy overhead per mask; a chunk's arrays stay in the CPU caches, which
    matters more than the per-chunk overhead). Most numbers of a COCO string
    take one character, so the characters beyond the first of a number are
    added in a short loop over their position.

    Returns:
      (runs int64 [M], counts int64 [len(strings)]): string ``i`` holds the
      ``counts[i]`` runs that follow those of the strings before it.

    Raises:
      ValueError: ``"string {i}: ..."`` for the first string with a character
        outside the code's alphabet, a truncated last number, or a run too
        large to be one.
    """
    encoded = [s.encode("ascii") if isinstance(s, str) else bytes(s) for s in strings]
    lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
    cuts = np.searchsorted(np.cumsum(lengths), np.arange(CHUNK_CHARS, int(lengths.sum()), CHUNK_CHARS), side="right")
    bounds = [0, *sorted(set(cuts.tolist()) - {0, len(encoded)}), len(encoded)]
    runs, counts = [], []
    for first, last in itertools.pairwise(bounds):
        try:
            chunk_runs, chunk_counts = _chunk_runs(encoded[first:last], lengths[first:last])
        except ValueError as error:
            position, why = str(error).split(": ", 1)
            raise ValueError(f"string {first + int(position.split()[1])}: {why}") from None
        runs.append(chunk_runs)
        counts.append(chunk_counts)
    if not runs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(runs), np.concatenate(counts)


def _chunk_runs(encoded: list, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`strings_runs_flat` of one chunk of ASCII strings (their lengths given)."""
    n_strings = len(encoded)
    string_end = np.cumsum(lengths)
    chars = np.frombuffer(b"".join(encoded), np.uint8) - np.uint8(48)  # wraps: bad characters become > 63
    if chars.size == 0:
        return np.zeros(0, np.int64), np.zeros(n_strings, np.int64)

    def fail(char_index, why):
        raise ValueError(f"string {int(np.searchsorted(string_end, char_index, side='right'))}: {why}")

    bad = np.flatnonzero(chars > 63)
    if bad.size:
        fail(bad[0], "characters outside the RLE alphabet")
    last = (chars & 0x20) == 0  # the last character of a number
    last_chars = string_end[lengths > 0] - 1
    truncated = last_chars[~last[last_chars]]
    if truncated.size:
        fail(truncated[0], "the last number is truncated")
    ends = np.flatnonzero(last)
    starts = np.empty_like(ends)
    starts[0], starts[1:] = 0, ends[:-1] + 1
    group_lengths = ends - starts + 1
    longest = int(group_lengths.max())
    if longest > 12:
        fail(ends[np.argmax(group_lengths)], "a run length is too large")
    values = (chars[starts] & 0x1F).astype(np.int64)
    longer = np.flatnonzero(group_lengths > 1)
    for position in range(1, longest):  # characters after the first of a number (few)
        if position > 1:
            longer = longer[group_lengths[longer] > position]
        values[longer] += (chars[starts[longer] + position] & 0x1F).astype(np.int64) << (5 * position)
    negative = np.flatnonzero(chars[ends] & 0x10)
    values[negative] -= np.left_shift(np.int64(1), 5 * group_lengths[negative])
    numbers = np.diff(np.searchsorted(ends, string_end), prepend=0)  # numbers ending in each string
    return _undo_differences(values, numbers), numbers


def _undo_differences(values: np.ndarray, numbers: np.ndarray) -> np.ndarray:
    """Runs from the stored numbers: run ``i >= 3`` of a string is stored as its difference to run ``i - 2``.

    So run ``i >= 1`` is the sum of the stored numbers ``j`` of its string with
    ``1 <= j <= i`` and ``j = i (mod 2)``: two interleaved cumulative sums over
    the whole array, minus their value where each string's chains begin.
    """
    first = (np.cumsum(numbers) - numbers)[numbers > 0]
    numbers = numbers[numbers > 0]
    chained = values.copy()
    chained[first] = 0  # run 0 starts no chain
    running = np.empty_like(chained)
    running[0::2], running[1::2] = np.cumsum(chained[0::2]), np.cumsum(chained[1::2])
    padded = np.concatenate([[0, 0], running])  # padded[g + 2] = running[g]
    # Chain bases of each string: running at the last positions before its first of either parity.
    odd_start = (first & 1).astype(bool)
    base_even = np.where(odd_start, padded[first + 1], padded[first])  # position first-1 or first-2
    base_odd = np.where(odd_start, padded[first], padded[first + 1])
    base = np.repeat(base_even, numbers)
    base[1::2] = np.repeat(base_odd, numbers)[1::2]
    out = running - base
    out[first] = values[first]
    return out


def strings_runs(strings: list) -> list[np.ndarray]:
    """The run lengths of many compressed RLE strings, each int64 [m]; see :func:`strings_runs_flat`."""
    if not strings:
        return []
    runs, counts = strings_runs_flat(strings)
    return np.split(runs, np.cumsum(counts)[:-1])


def string_runs(counts) -> np.ndarray:
    """The run lengths of one compressed RLE string (str or bytes), int64 [m]; see :func:`strings_runs`."""
    try:
        return strings_runs([counts])[0]
    except ValueError as error:
        raise ValueError(str(error).split(": ", 1)[1]) from None


def runs_to_string(runs) -> str:
    """The compressed string of run lengths (the inverse of :func:`string_runs`; pycocotools' encoder)."""
    runs = [int(v) for v in runs]
    out = []
    for index, value in enumerate(runs):
        x = value - runs[index - 2] if index > 2 else value
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = (x != -1) if (c & 0x10) else (x != 0)
            if more:
                c |= 0x20
            out.append(chr(c + 48))
    return "".join(out)


def encode_mask(mask) -> str:
    """The compressed RLE string of a bool[H, W] mask (column-major runs, the first one background;
    pycocotools' ``encode(...)["counts"]``)."""
    flat = np.asarray(mask, bool).ravel(order="F")
    if flat.size == 0:
        return runs_to_string([0])
    bounds = np.concatenate([[0], np.flatnonzero(flat[1:] != flat[:-1]) + 1, [flat.size]])
    runs = np.diff(bounds)
    if flat[0]:
        runs = np.concatenate([[0], runs])
    return runs_to_string(runs)


def decode_mask(counts, size) -> np.ndarray:
    """The bool[H, W] mask of a compressed RLE string and its ``size`` (H, W) (the inverse of `encode_mask`).

    Raises:
      ValueError: the runs do not cover exactly H * W pixels, or the string is malformed.
    """
    height, width = (int(v) for v in size)
    runs = np.asarray(string_runs(counts), np.int64)
    if runs.min(initial=0) < 0 or int(runs.sum()) != height * width:
        raise ValueError(f"RLE runs cover {int(runs.sum())} pixels, not {height} x {width}")
    flat = np.repeat(np.arange(runs.shape[0]) % 2 == 1, runs)
    return flat.reshape(width, height).T.copy()


def foreground_pixels(runs: np.ndarray) -> int:
    """Pixels of a mask given by its runs (the odd runs)."""
    return int(np.asarray(runs)[1::2].sum())


@functools.lru_cache(maxsize=64)
def _valid_words(height: int, width: int, words_per_column: int, columns: int) -> np.ndarray:
    """uint32 [columns * words_per_column]: the bits of the image's pixels in one mask slot (cached, read-only)."""
    full, tail = divmod(height, WORD_BITS)
    column = np.zeros(words_per_column, np.uint32)
    column[:full] = 0xFFFFFFFF
    if tail:
        column[full] = (1 << tail) - 1
    valid = np.zeros((columns, words_per_column), np.uint32)
    valid[:width] = column
    valid = valid.reshape(-1)
    valid.flags.writeable = False
    return valid


def _toggle_positions(masks: list, slot_bits: int, stride: int) -> np.ndarray:
    """Sorted bit positions (in the whole buffer) where the foreground state flips."""
    positions = []
    for slot, (runs, height, _) in enumerate(masks):
        ends = np.cumsum(np.asarray(runs, np.int64))
        toggles = ends if len(ends) % 2 == 0 else ends[:-1]  # a last foreground run closes at the image end
        x, y = np.divmod(toggles, np.int64(height))
        positions.append(slot * np.int64(slot_bits) + x * np.int64(stride) + y)
    return np.concatenate(positions)


def decode_into(masks: list, out: np.ndarray) -> None:
    """Decodes masks into the first ``len(masks)`` slots of a packed buffer, all at once.

    Args:
      masks: list of ``(runs int64 [m], height, width)``; runs must cover
        ``height * width`` pixels (checked by the loaders).
      out: uint32 [N, W_canvas, h_canvas] buffer, ``len(masks) <= N``, every
        ``width <= W_canvas`` and ``height <= 32 h_canvas``. On return slot
        ``i`` holds mask ``i`` column by column: bit ``j`` of word ``[i, x, k]``
        is pixel ``(32 k + j, x)``; every other bit of those slots is 0.
    """
    if not masks:
        return
    n_slots, columns, words_per_column = out.shape
    slot_words = columns * words_per_column
    total = len(masks) * slot_words
    position = _toggle_positions(masks, WORD_BITS * slot_words, WORD_BITS * words_per_column)
    position = position[position < np.int64(WORD_BITS) * total]
    word = position >> 5
    flips = (_ALL << (position & 31).astype(np.uint64)) & _ALL
    words = np.zeros(total, np.uint32)
    if word.size:
        first = np.flatnonzero(np.concatenate([[True], word[1:] != word[:-1]]))
        toggled = word[first]
        # State entering each word: the parity of the flips in the words before it, constant between toggled words.
        parity = (np.cumsum(np.diff(np.append(first, word.size))) & 1).astype(bool)
        levels = np.where(np.concatenate([[False], parity]), np.uint32(0xFFFFFFFF), np.uint32(0))
        lengths = np.diff(np.concatenate([[0], toggled + 1, [total]]))
        words = np.repeat(levels, lengths)
        words[toggled] ^= np.bitwise_xor.reduceat(flips, first).astype(np.uint32)
    slots = out.reshape(n_slots, -1)[: len(masks)]
    for slot, (_, height, width) in enumerate(masks):
        np.bitwise_and(words[slot * slot_words:(slot + 1) * slot_words],
                       _valid_words(height, width, words_per_column, columns), out=slots[slot])


__all__ = ["strings_runs_flat", "strings_runs", "string_runs", "runs_to_string", "encode_mask", "decode_mask",
           "foreground_pixels", "decode_into"]
