"""jaxseg_robust: JAX-native robustness evaluation for segmentation models.

The public API is `jaxseg_robust.runs`: a frozen `RunSpec` (model, data,
protocol, engine settings) and ``evaluate(spec, run_dir)``, which runs it as
the command line does (README, "From Python"). Its names are also reachable
from here (``jaxseg_robust.evaluate``, ``jaxseg_robust.TetrisSpec``, ...);
they are imported on first use, so ``import jaxseg_robust`` stays light.
"""

__version__ = "0.1.0"

PUBLIC_NAMES = ("evaluate", "RunSpec", "ModelSpec", "DataSpec", "EngineSpec", "RunResult", "RunError",
                "TetrisSpec", "BrepsSpec", "GridSpec", "RClicksSpec", "PerturbSpec", "ClickabilitySpec")


def __getattr__(name: str):
    """The names of `jaxseg_robust.runs` in `PUBLIC_NAMES`, imported on first use (PEP 562)."""
    if name in PUBLIC_NAMES:
        from jaxseg_robust import runs  # noqa: PLC0415

        return runs.__dict__[name]
    raise AttributeError(f"module 'jaxseg_robust' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *PUBLIC_NAMES])
