"""The device flags the benchmarks share: where the torch reference runs and at which precision each side computes.

  --torch-device cpu|cuda   the reference's device; on cuda every clock read of the reference follows
                            ``torch.cuda.synchronize()`` (`torch_sync`)
  --torch-tf32              let torch run float32 convolutions and matrix products as TF32 on cuda
                            (default off: the reference is strict float32, what "torch fp32" means in
                            docs/benchmarking.md)
  --precision P             JAX's float32 matrix-product precision (`jaxseg_robust.runner.precision`:
                            default | high | highest), applied around our side with `jax_precision`

`device_lines` is the header every script prints with these settings.
"""

from __future__ import annotations

import contextlib

PRECISIONS = ("default", "high", "highest")


def add_device_flags(parser, *, torch_device: bool = True) -> None:
    """Adds ``--precision`` and (unless ``torch_device`` is False) ``--torch-device`` and ``--torch-tf32``."""
    parser.add_argument("--precision", choices=PRECISIONS, default="default",
                        help="JAX float32 matmul precision of our side (default %(default)s; "
                             "jax.default_matmul_precision)")
    if torch_device:
        parser.add_argument("--torch-device", choices=("cpu", "cuda"), default="cpu",
                            help="device of the torch reference (default %(default)s)")
        parser.add_argument("--torch-tf32", action="store_true",
                            help="allow TF32 in torch's float32 convolutions and matmuls on cuda "
                                 "(default: strict float32)")


def configure_torch(args):
    """The reference's `torch.device`, with TF32 set as ``--torch-tf32`` says.

    Raises:
      SystemExit: ``--torch-device cuda`` without a CUDA device (one line).
    """
    import torch  # noqa: PLC0415

    device = torch.device(getattr(args, "torch_device", "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--torch-device cuda: torch sees no CUDA device")
    allow = bool(getattr(args, "torch_tf32", False))
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow
    return device


def torch_sync(device) -> None:
    """``torch.cuda.synchronize()`` when ``device`` is a CUDA device (call before every clock read)."""
    if device.type == "cuda":
        import torch  # noqa: PLC0415

        torch.cuda.synchronize(device)


def jax_precision(args):
    """Context manager: our side at ``args.precision`` (`jaxseg_robust.runner.precision.matmul_precision`)."""
    from jaxseg_robust.runner.precision import matmul_precision  # noqa: PLC0415

    precision = getattr(args, "precision", None)
    return contextlib.nullcontext() if precision is None else matmul_precision(precision)


def device_lines(args) -> list[str]:
    """Header lines: JAX's backend and matmul precision, the torch device and its float32 settings."""
    import jax  # noqa: PLC0415
    import torch  # noqa: PLC0415

    device = getattr(args, "torch_device", "cpu")
    name = torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else "cpu"
    return [f"# jax backend {jax.default_backend()} ({jax.devices()[0].device_kind}); jax matmul precision "
            f"{getattr(args, 'precision', 'default')}",
            f"# torch device {device} ({name}); cuda.matmul.allow_tf32 {torch.backends.cuda.matmul.allow_tf32}, "
            f"cudnn.allow_tf32 {torch.backends.cudnn.allow_tf32}"]
