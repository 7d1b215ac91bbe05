"""Tests for jaxseg_robust.ops.resize (SAM-style resizing)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxseg_robust.ops import resize as R

# ---- independent float64 references (written from the torch definitions) ----


def ref_linear_1d(x: np.ndarray, out_size: int, axis: int) -> np.ndarray:
    """torch interpolate(linear, align_corners=False) along one axis, float64, direct loop."""
    x = np.moveaxis(np.asarray(x, np.float64), axis, -1)
    n = x.shape[-1]
    out = np.empty(x.shape[:-1] + (out_size,))
    for o in range(out_size):
        s = max((n / out_size) * (o + 0.5) - 0.5, 0.0)
        i0 = min(int(np.floor(s)), n - 1)
        i1 = i0 + 1 if i0 < n - 1 else i0
        lam = s - i0
        out[..., o] = (1 - lam) * x[..., i0] + lam * x[..., i1]
    return np.moveaxis(out, -1, axis)


def ref_postprocess(low: np.ndarray, resized_hw, original_hw, model_size: int) -> np.ndarray:
    """SAM postprocess_masks: upsample to model frame, crop, resize to original (float64)."""
    big = ref_linear_1d(ref_linear_1d(low, model_size, -1), model_size, -2)
    crop = big[..., :resized_hw[0], :resized_hw[1]]
    return ref_linear_1d(ref_linear_1d(crop, original_hw[1], -1), original_hw[0], -2)


def ref_antialias_1d(x: np.ndarray, out_size: int) -> np.ndarray:
    """Triangle-filter resampling widened by the downscale factor, float64 (PIL/torch AA)."""
    n = x.shape[0]
    scale = n / out_size
    support = max(scale, 1.0)
    out = np.empty((out_size,) + x.shape[1:])
    for o in range(out_size):
        centre = scale * (o + 0.5)
        pos = np.arange(n) + 0.5
        w = np.maximum(0.0, 1.0 - np.abs(pos - centre) / support)
        out[o] = np.tensordot(w / w.sum(), x, axes=(0, 0))
    return out


# ---- longest side ----------------------------------------------------------


def test_longest_side_shape_examples():
    assert R.longest_side_shape(321, 481, 1024) == (683, 1024)
    assert R.longest_side_shape(480, 854, 1024) == (576, 1024)
    assert R.longest_side_shape(1500, 900, 1024) == (1024, 614)
    assert R.longest_side_shape(1024, 1024, 1024) == (1024, 1024)
    assert R.longest_side_shape(1, 3000, 1024) == (0, 1024)  # degenerate; preprocess rejects it


@pytest.mark.parametrize("bad", [(0, 5, 10), (5, -1, 10), (5, 5, 0), (2.5, 3, 10)])
def test_longest_side_shape_rejects_bad_sizes(bad):
    with pytest.raises(ValueError):
        R.longest_side_shape(*bad)


# ---- tap tables ---------------------------------------------------------------


@given(st.integers(1, 300), st.integers(1, 300))
def test_antialias_taps_are_normalised_and_local(n_in, n_out):
    index, weight = R.antialias_taps(n_in, n_out)
    assert index.shape == weight.shape and index.shape[0] == n_out
    np.testing.assert_allclose(weight.sum(1), 1.0, atol=1e-5)
    assert (weight >= 0).all() and (index >= 0).all() and (index < n_in).all()


@given(st.integers(1, 200), st.integers(1, 200))
def test_antialias_resize_matches_triangle_filter_reference(n_in, n_out):
    x = np.random.default_rng(n_in * 1000 + n_out).uniform(0, 255, (n_in, 3)).astype(np.float32)
    index, weight = R.antialias_taps(n_in, n_out)
    got = (x[index] * weight[..., None]).sum(1)
    # The taps reproduce torch's float32 weight arithmetic, which drifts from the exact
    # filter by up to ~1e-4 of the value range (bit-exactness vs torch: parity test).
    np.testing.assert_allclose(got, ref_antialias_1d(x, n_out), atol=255 * 1.2e-4)


def test_antialias_host_equals_device_version():
    x = np.random.default_rng(4).uniform(0, 255, (57, 40, 3)).astype(np.float32)
    for out_hw in ((23, 91), (57, 40), (200, 13)):
        host = R.resize_bilinear_antialias_host(x.astype(np.uint8), out_hw)
        device = np.asarray(R.resize_bilinear_antialias(jnp.asarray(x.astype(np.uint8),
                                                                    jnp.float32), out_hw))
        assert host.dtype == np.float32 and host.shape == out_hw + (3,)
        np.testing.assert_allclose(host, device, atol=1e-4)
    with pytest.raises(ValueError):
        R.resize_bilinear_antialias_host(x[..., 0], (5, 5))


def test_antialias_identity_and_constant():
    x = np.random.default_rng(0).uniform(0, 255, (37, 41, 3)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(R.resize_bilinear_antialias(jnp.asarray(x), (37, 41))), x)
    const = np.full((90, 50, 3), 17.25, np.float32)
    out = np.asarray(R.resize_bilinear_antialias(jnp.asarray(const), (23, 71)))
    np.testing.assert_allclose(out, 17.25, atol=1e-4)


@given(st.integers(1, 120), st.integers(1, 300))
def test_linear_taps_match_reference(n_in, n_out):
    x = np.random.default_rng(n_in + 7 * n_out).normal(size=(n_in,)).astype(np.float32)
    got = (x[R.linear_taps(n_in, n_out)[0]] * R.linear_taps(n_in, n_out)[1]).sum(1)
    # float32 source positions (as torch) vs the float64 reference: ~1 ulp of position.
    np.testing.assert_allclose(got, ref_linear_1d(x, n_out, 0), atol=1e-4)


@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 60), st.integers(1, 60))
def test_resize_bilinear_taps_match_reference(h, w, oh, ow):
    x = np.random.default_rng(h * w + oh).normal(size=(2, h, w)).astype(np.float32)
    (iy, wy), (ix, wx) = R.linear_taps(h, oh), R.linear_taps(w, ow)
    got = (x[:, :, ix] * wx).sum(-1)  # columns, then rows, as resize_bilinear
    got = (got[:, iy, :] * wy[None, :, :, None]).sum(2)
    want = ref_linear_1d(ref_linear_1d(x, ow, -1), oh, -2)
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_resize_bilinear_applies_the_taps():
    x = np.random.default_rng(5).normal(size=(2, 13, 29)).astype(np.float32)
    got = np.asarray(jax.jit(R.resize_bilinear, static_argnums=1)(jnp.asarray(x), (31, 8)))
    np.testing.assert_allclose(got, ref_linear_1d(ref_linear_1d(x, 8, -1), 31, -2), atol=1e-4)


# ---- postprocess with traced sizes --------------------------------------------

FRAME = (72, 76)


@functools.lru_cache(maxsize=None)
def _upsample_fn(frame, model_size, fill_value):
    return jax.jit(lambda x, r, o: R.upsample_sam_logits(x, r, o, frame, model_size=model_size,
                                                         fill_value=fill_value))


@given(st.integers(1, FRAME[0]), st.integers(1, FRAME[1]))
def test_upsample_sam_logits_equals_crop_then_resize(h, w):
    model_size, low = 64, 16
    resized = tuple(max(v, 1) for v in R.longest_side_shape(h, w, model_size))
    logits = np.random.default_rng(h * 71 + w).normal(0, 5, (2, low, low)).astype(np.float32)
    fn = _upsample_fn(FRAME, model_size, -7.0)
    got = np.asarray(fn(logits, np.asarray(resized), np.asarray((h, w))))
    want = ref_postprocess(logits, resized, (h, w), model_size)
    np.testing.assert_allclose(got[:, :h, :w], want, atol=2e-5 * np.abs(logits).max())
    assert (got[:, h:, :] == -7.0).all() and (got[:, :, w:] == -7.0).all()


def test_upsample_sam_logits_one_compile_for_many_sizes_and_vmap():
    model_size, low, frame = 64, 16, (50, 60)
    fn = jax.jit(lambda x, r, o: R.upsample_sam_logits(x, r, o, frame, model_size=model_size))
    rng = np.random.default_rng(1)
    shapes = [(50, 60), (13, 40), (33, 7), (1, 1)]
    batch_x, batch_r, batch_o = [], [], []
    for h, w in shapes:
        resized = tuple(max(v, 1) for v in R.longest_side_shape(h, w, model_size))
        x = rng.normal(size=(low, low)).astype(np.float32)
        got = np.asarray(fn(x, np.asarray(resized), np.asarray((h, w))))
        np.testing.assert_allclose(got[:h, :w], ref_postprocess(x, resized, (h, w), model_size),
                                   atol=1e-4)
        batch_x.append(x), batch_r.append(resized), batch_o.append((h, w))
    assert fn._cache_size() == 1
    batched = jax.vmap(fn)(np.stack(batch_x), np.asarray(batch_r), np.asarray(batch_o))
    for i, (h, w) in enumerate(shapes):
        np.testing.assert_allclose(np.asarray(batched[i]),
                                   np.asarray(fn(batch_x[i], np.asarray(batch_r[i]),
                                                 np.asarray(batch_o[i]))), atol=1e-6)


def test_upsample_sam_logits_gradient_is_the_transpose():
    model_size, low, frame = 32, 8, (20, 30)
    resized, original = jnp.asarray((21, 32)), jnp.asarray((20, 30))
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(low, low)).astype(np.float32))
    cot = jnp.asarray(rng.normal(size=frame).astype(np.float32))

    @jax.jit
    def loss(v):
        return jnp.sum(R.upsample_sam_logits(v, resized, original, frame,
                                             model_size=model_size) * cot)

    grad = jax.jit(jax.grad(loss))(x)
    for _ in range(3):  # the map is linear: <grad, d> = loss(d) exactly
        d = jnp.asarray(rng.normal(size=(low, low)).astype(np.float32))
        np.testing.assert_allclose(float(jnp.sum(grad * d)), float(loss(d)), rtol=1e-4, atol=1e-4)


def test_pad_to_square_and_scale_factors():
    x = jnp.ones((3, 5, 3))
    out = R.pad_to_square(x, 8)
    assert out.shape == (8, 8, 3) and float(out.sum()) == 45.0
    with pytest.raises(ValueError):
        R.pad_to_square(jnp.ones((9, 2, 3)), 8)
    np.testing.assert_allclose(R.scale_factors((321, 481), (683, 1024)),
                               [1024 / 481, 683 / 321], rtol=1e-6)
    with pytest.raises(ValueError):
        R.scale_factors((0, 5), (3, 3))


# ---- parity with torch -------------------------------------------------------


@pytest.mark.parity
@pytest.mark.parametrize("hw, out_hw", [((321, 481), (683, 1024)), ((1500, 900), (1024, 614)),
                                        ((1200, 1300), (945, 1024)), ((2000, 3000), (683, 1024)),
                                        ((7, 5), (1024, 731))])
def test_antialias_resize_matches_torch(hw, out_hw):
    torch = pytest.importorskip("torch")
    img = np.random.default_rng(0).uniform(0, 255, hw + (3,)).astype(np.float32)
    want = torch.nn.functional.interpolate(torch.from_numpy(img).permute(2, 0, 1)[None], out_hw,
                                           mode="bilinear", align_corners=False, antialias=True)
    got = np.asarray(R.resize_bilinear_antialias(jnp.asarray(img), out_hw))
    np.testing.assert_allclose(got, want[0].permute(1, 2, 0).numpy(), atol=1e-4)
    host = R.resize_bilinear_antialias_host(img, out_hw)
    np.testing.assert_allclose(host, want[0].permute(1, 2, 0).numpy(), atol=1e-4)


@pytest.mark.parity
@pytest.mark.parametrize("hw", [(321, 481), (1500, 900), (1024, 1024), (50, 70), (2000, 1999)])
def test_upsample_sam_logits_matches_torch_postprocess(hw):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    h, w = hw
    resized = R.longest_side_shape(h, w, 1024)
    low = np.random.default_rng(0).normal(0, 10, (3, 256, 256)).astype(np.float32)
    t = F.interpolate(torch.from_numpy(low)[None], (1024, 1024), mode="bilinear",
                      align_corners=False)[..., :resized[0], :resized[1]]
    want = F.interpolate(t, hw, mode="bilinear", align_corners=False)[0].numpy()
    got = np.asarray(R.upsample_sam_logits(jnp.asarray(low), jnp.asarray(resized),
                                           jnp.asarray(hw), hw))
    # The traced second stage computes source positions without torch's fused
    # multiply-add: one float32 ulp of position, <= ~1e-5 of the logit scale.
    np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(low).max())
    np.testing.assert_array_equal(R.linear_taps(256, 1024)[0][:, 0],
                                  np.clip(np.floor((np.arange(1024) + 0.5) / 4 - 0.5), 0, 255))


# ---- periodic (phase-by-phase) application of upsampling tables --------------

def _table(kind: str, n_in: int, n_out: int):
    from jaxseg_robust.models.clickability.resize import align_corners_taps  # noqa: PLC0415
    from jaxseg_robust.models.simpleclick.vit import bicubic_taps  # noqa: PLC0415
    return {"linear": R.linear_taps, "bicubic": bicubic_taps, "align_corners": align_corners_taps}[kind](n_in, n_out)


@pytest.mark.parametrize("factor", [2, 4, 8])
@pytest.mark.parametrize("kind", ["linear", "bicubic"])
def test_half_pixel_upsampling_tables_are_periodic(kind, factor):
    """torch's bilinear / bicubic x2, x4, x8 tables: every phase periodic but for its clamped border rows."""
    border = {"linear": 1, "bicubic": 3}[kind]  # rows of a phase that read a clamped index
    for n_in in ((3, 7, 14, 28, 56) if kind == "linear" else (7, 14, 28, 56)):
        index, weight = _table(kind, n_in, factor * n_in)
        phases = R.periodic_phases(index, weight, n_in)
        assert phases is not None and len(phases) == factor
        assert all(hi - lo >= n_in - border for lo, hi, _, _ in phases)


def test_non_multiple_sizes_and_downsampling_take_the_gathers():
    for n_in, n_out in ((7, 10), (14, 7), (5, 5), (1, 8)):
        index, weight = R.linear_taps(n_in, n_out)
        assert R.periodic_phases(index, weight, n_in) is None
    # bicubic from 2 samples: even the middle output reads a clamped (repeated) index
    index, weight = _table("bicubic", 2, 8)
    assert R.periodic_phases(index, weight, 2) is None


@given(st.sampled_from(["linear", "bicubic", "align_corners"]), st.integers(2, 40), st.integers(2, 8),
       st.integers(0, 2))
def test_periodic_application_is_the_gather_to_rounding(kind, n_in, factor, axis):
    """Same products summed in the same order: the phase path equals the gathers up to XLA's
    contraction of a product and a sum into one fused multiply-add (1 ulp), in either; its reverse
    pass (pads and sums instead of a scatter-add) agrees to float32 rounding."""
    taps = _table(kind, n_in, factor * n_in)
    shape = [3, 4, 5]
    shape[axis] = n_in
    rng = np.random.default_rng(n_in * 31 + factor)
    x = jnp.asarray(rng.normal(size=shape).astype(np.float32))
    got = jax.jit(lambda x: R.apply_taps(x, taps, axis))(x)
    want = jax.jit(lambda x: R._gather_taps(x, taps, axis))(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    w = jnp.asarray(rng.normal(size=got.shape).astype(np.float32))
    g_got = jax.grad(lambda x: jnp.sum(R.apply_taps(x, taps, axis) * w))(x)
    g_want = jax.grad(lambda x: jnp.sum(R._gather_taps(x, taps, axis) * w))(x)
    np.testing.assert_allclose(np.asarray(g_got), np.asarray(g_want), rtol=1e-5, atol=1e-5)


def test_periodic_application_under_vmap_and_in_float64():
    taps = R.linear_taps(6, 24)
    with jax.enable_x64(True):
        x = jnp.asarray(np.random.default_rng(3).normal(size=(2, 6, 5)))
        got = jax.vmap(lambda xi: R.apply_taps(xi, (taps[0], taps[1].astype(np.float64)), 0))(x)
        assert got.dtype == jnp.float64 and got.shape == (2, 24, 5)
        np.testing.assert_allclose(np.asarray(got), ref_linear_1d(np.asarray(x), 24, 1), rtol=0, atol=1e-6)
