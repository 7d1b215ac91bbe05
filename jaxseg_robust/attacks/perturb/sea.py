"""SEA's four APGD attacks of the battery: SEA-BCE, SEA-MCE, SEA-JSD, SEA-MSL (§3).

Section numbers (§) refer to docs/protocols/perturbation.md.

| attack  | optimised per-pixel loss                        | tracked loss                                  |
|---------|-------------------------------------------------|-----------------------------------------------|
| SEA-BCE | SegPGD balanced CE, λ_t = t/(2T) per stage      | CE                                            |
| SEA-MCE | c·CE                                            | CE                                            |
| SEA-JSD | JS(softmax, one-hot), closed form               | CE                                            |
| SEA-MSL | -c·z_y/‖z‖₂                                     | masked MSL (C-R) or unmasked -z_y/‖z‖₂ (C-S1) |

Switches (§8.2): ``schedule`` #1 (``"progressive"`` default: stages
(2ε, 90), (1.5ε, 90), (ε, 120) with per-image early stop at accuracy 0;
``"single"``: C-R's one (ε, 300) run, no early stop, then the result replaces
the clean image only if its accuracy is < 1), ``msl_track`` #2 (``None``
follows the schedule: progressive -> ``"unmasked"``, single -> ``"masked"``),
``reference_quirks`` #9 (start-point accuracy counts void as wrong).
"""

from __future__ import annotations

from jaxseg_robust.attacks.perturb.apgd import apgd, progressive_stages, single_stage
from jaxseg_robust.attacks.perturb.common import DEFAULT_EPSILON, AttackResult, LogitsFn

SEA_LOSSES = ("bce", "mce", "jsd", "msl")
SEA_SCHEDULES = ("progressive", "single")
MSL_TRACKS = ("masked", "unmasked")
_OPTIMIZED = {"bce": "balanced_ce", "mce": "masked_ce", "jsd": "jsd", "msl": "masked_spherical"}


def sea_losses(loss: str, schedule: str = "progressive", msl_track: str | None = None) -> tuple[str, str]:
    """(optimised, tracked) APGD loss names of a SEA attack (see the module table)."""
    if loss not in SEA_LOSSES:
        raise ValueError(f"loss must be one of {SEA_LOSSES}, got {loss!r}")
    if schedule not in SEA_SCHEDULES:
        raise ValueError(f"schedule must be one of {SEA_SCHEDULES}, got {schedule!r}")
    if msl_track is None:
        msl_track = "unmasked" if schedule == "progressive" else "masked"
    if msl_track not in MSL_TRACKS:
        raise ValueError(f"msl_track must be one of {MSL_TRACKS} or None, got {msl_track!r}")
    if loss != "msl":
        return _OPTIMIZED[loss], "ce"
    return _OPTIMIZED[loss], "masked_spherical" if msl_track == "masked" else "spherical"


def sea(logits_fn: LogitsFn, params, images, labels, mask, keys, *, loss: str | tuple[str, ...],
        epsilon: float = DEFAULT_EPSILON, schedule: str = "progressive", total_iterations: int = 300,
        msl_track: str | None = None, reference_quirks: bool = True, loss_index=None,
        region=None) -> AttackResult:
    """One SEA attack of the battery (jitted per static configuration through :func:`apgd.apgd`).

    Args:
      logits_fn: ``(params, f32[B,H,W,3]) -> f32[B,H,W,C]``.
      params: model parameters.
      images: f32[B, H, W, 3] clean images in [0, 1].
      labels: int[B, H, W] attack labels in [0, C).
      mask: bool[B, H, W] attack mask.
      keys: typed PRNG key array [B] (uniform start).
      loss: ``"bce"``, ``"mce"``, ``"jsd"`` or ``"msl"``.
      epsilon: ε (image units), default 8/255.
      schedule: ``"progressive"`` (default) or ``"single"``.
      total_iterations: N = 300 (split 90/90/120 when progressive).
      msl_track: ``"masked"``, ``"unmasked"`` or None (follow the schedule).
      reference_quirks: §3.5 start-point accuracy quirk.
      loss_index: with a tuple of losses, the traced index of the one to run
        (one compiled program for several SEA members).
      region: bool[B, H, W] the image's pixels in a spatially padded frame, or None (§10.6).

    Returns:
      AttackResult of :func:`apgd.apgd`; the returned image is always in the ε-ball.
    """
    if isinstance(loss, str):
        optimized, tracked = sea_losses(loss, schedule, msl_track)
    else:
        pairs = [sea_losses(name, schedule, msl_track) for name in loss]
        optimized, tracked = tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    progressive = schedule == "progressive"
    stages = progressive_stages(total_iterations) if progressive else single_stage(total_iterations)
    return apgd(logits_fn, params, images, labels, mask, keys, loss=optimized, track_loss=tracked,
                epsilon=float(epsilon), stages=stages, early_stop=progressive, accept_if_improved=not progressive,
                reference_quirks=bool(reference_quirks), loss_index=loss_index, region=region)
