"""Shared test configuration: hypothesis profiles and the real-data location."""

from __future__ import annotations

import os
import pathlib

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("thorough", deadline=None, max_examples=400,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# The command line's persistent compilation cache is off in the test session (`runner.compile_cache`): a test
# never writes into the user's cache; the tests of the cache pass their own temporary --compile-cache DIR.
os.environ["JAXSEG_ROBUST_COMPILE_CACHE"] = "off"

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
# ../shared/data/real beside the checkout, or $JAXSEG_REAL_DATA.
REAL_DATA = pathlib.Path(os.environ.get("JAXSEG_REAL_DATA", REPO_ROOT.parent / "shared" / "data" / "real"))


@pytest.fixture(scope="session")
def real_data_dir() -> pathlib.Path:
    """The shared real image/mask folder; skips the test cleanly when absent."""
    if not REAL_DATA.is_dir():
        pytest.skip(f"real data not present at {REAL_DATA}")
    return REAL_DATA


# The default selection (pyproject addopts) runs small models, where XLA's compile time dominates:
# LLVM optimisation level 0 compiles about 2.8x faster (the TETRIS CLI program: 23.8 s -> 8.6 s) and
# the whole default suite runs faster. Parity and slow selections execute full-size models, where
# optimised machine code matters, so they keep XLA's default. An explicit setting in XLA_FLAGS wins.
DEFAULT_MARKEXPR = "not parity and not slow"
FAST_COMPILE_FLAG = "--xla_backend_optimization_level=0"


def pytest_configure(config):
    """Sets ``FAST_COMPILE_FLAG`` for the default selection (before any test initialises a JAX backend)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_backend_optimization_level" in flags or config.getoption("markexpr") != DEFAULT_MARKEXPR:
        return
    os.environ["XLA_FLAGS"] = f"{flags} {FAST_COMPILE_FLAG}".strip()


def _release_compiled_programs() -> None:
    """Drops every compiled XLA program the finished module left behind.

    Each CPU executable keeps its JIT-linked code in memory mappings; the whole default suite
    compiles thousands of programs, and without this the process passed Linux's default limit of
    65,530 mappings (`vm.max_map_count`) and crashed inside XLA's compiler (measured: ~4,000
    mappings per minute of attack tests). JAX's own caches are cleared, and so are the library's
    memoised compiled programs (`functools.lru_cache` of the batch program, predictors, ...).
    """
    import gc  # noqa: PLC0415
    import sys  # noqa: PLC0415

    import jax  # noqa: PLC0415

    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("jaxseg_robust"):
            continue
        for value in list(vars(module).values()):
            clear = getattr(value, "cache_clear", None)
            if callable(clear) and getattr(value, "__module__", None) == name:
                clear()
    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="module", autouse=True)
def _fresh_compilation_caches_per_module():
    """Runs each test module, then releases the programs it compiled (`_release_compiled_programs`)."""
    yield
    _release_compiled_programs()
