"""The matmul precision of a run (`jaxseg_robust.runner.precision`) and its place in the run manifest."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxseg_robust.runner.precision import MATMUL_PRECISIONS, matmul_precision, recorded_precision
from jaxseg_robust.runner.rundir import ManifestMismatchError, open_run_dir, read_manifest

FINGERPRINTS = {"model": "sha256:aa", "dataset": "sha256:bb"}
ENGINE = {"frame_policy": "exact"}


def _dot_precisions(lowered_text: str) -> list[str]:
    return [line.split("precision = [")[1].split("]")[0] for line in lowered_text.splitlines()
            if "dot_general" in line and "precision = [" in line]


@pytest.mark.parametrize("name", MATMUL_PRECISIONS)
def test_programs_traced_in_the_scope_carry_its_precision_and_the_setting_is_restored(name):
    a = jnp.ones((8, 8), jnp.float32)
    with matmul_precision(name):
        inside = jax.jit(lambda x, y: x @ y).lower(a, a).as_text()
    assert _dot_precisions(inside) == [f"{name.upper()}, {name.upper()}"]
    assert jax.config.jax_default_matmul_precision is None
    explicit = jax.jit(lambda x, y: jnp.matmul(x, y, precision="highest"))
    with matmul_precision("default"):  # an explicit precision= is left alone
        assert _dot_precisions(explicit.lower(a, a).as_text()) == ["HIGHEST, HIGHEST"]


def test_xla_cpu_computes_full_float32_at_every_precision():
    """Why the CPU numbers (and the regression records) do not move with --precision."""
    if jax.default_backend() != "cpu":
        pytest.skip("the claim is about XLA:CPU")
    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.standard_normal((96, 160)), jnp.float32) for _ in range(2))
    conv_input = jnp.asarray(rng.standard_normal((1, 16, 16, 8)), jnp.float32)
    kernel = jnp.asarray(rng.standard_normal((3, 3, 8, 4)), jnp.float32)

    def work(x, y, image, w):
        conv = jax.lax.conv_general_dilated(image, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return x @ y.T, conv

    results = {}
    for name in MATMUL_PRECISIONS:
        with matmul_precision(name):
            results[name] = [np.asarray(r) for r in jax.jit(work)(a, b, conv_input, kernel)]
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64).T
    assert np.max(np.abs(results["default"][0] - exact)) < 1e-4 * np.max(np.abs(exact))
    for name in MATMUL_PRECISIONS:
        for got, want in zip(results[name], results["highest"]):
            np.testing.assert_array_equal(got, want)


def test_an_unknown_precision_is_one_line_naming_it():
    with pytest.raises(ValueError, match=r"one of default, high, highest; got 'tf32'") as info:
        with matmul_precision("tf32"):
            pass
    assert "\n" not in str(info.value)


def _open(path, precision=None, **overrides):
    config = {"protocol": "breps", "n": 3} | ({} if precision is None else {"matmul_precision": precision})
    return open_run_dir(path, config=config, fingerprints=FINGERPRINTS, engine=ENGINE, **overrides)


def test_a_resume_at_another_precision_is_refused_in_one_line_unless_overridden(tmp_path):
    _open(tmp_path, "highest").close()
    _open(tmp_path, "highest").close()  # the same precision resumes
    with pytest.raises(ManifestMismatchError) as info:
        _open(tmp_path, "default")
    message = str(info.value)
    assert "\n" not in message and str(tmp_path) in message
    assert "'highest'" in message and "'default'" in message and "--precision highest" in message
    assert len(read_manifest(tmp_path)["sessions"]) == 2  # the refused resume wrote nothing
    _open(tmp_path, "default", allow_mismatch=True).close()
    overridden = read_manifest(tmp_path)["sessions"][-1]["overridden_mismatches"]
    assert overridden == ['config.matmul_precision: recorded "highest", now "default"']


def test_a_run_directory_from_before_the_key_counts_as_default(tmp_path):
    _open(tmp_path).close()  # written without a precision
    assert recorded_precision(read_manifest(tmp_path)["config"]) == "default"
    with pytest.raises(ManifestMismatchError, match="computed at matmul precision 'default'"):
        _open(tmp_path, "highest")
    _open(tmp_path, "default").close()  # resumes without an override
    assert len(read_manifest(tmp_path)["sessions"]) == 2
