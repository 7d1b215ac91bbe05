"""Progress display for a run: tqdm when installed (extra `progress`), else a plain periodic line.

tqdm is not a core dependency; ``mode="auto"`` uses it when it can
be imported and falls back to `PlainProgress`, which prints one line to the
stream at most every ``interval_s`` seconds and once at the end.
"""

from __future__ import annotations

import sys
import time

PROGRESS_MODES = ("auto", "tqdm", "plain", "none")


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60:02d}:{rest % 60:02d}"


class PlainProgress:
    """Prints ``desc: done/total (pct) ok=.. failed=.. elapsed .. eta ..`` lines."""

    def __init__(self, total: int, desc: str = "run", stream=None, interval_s: float = 10.0):
        """``total`` instances to process; lines go to ``stream`` (default stderr)."""
        self.total, self.desc, self.interval_s = int(total), desc, float(interval_s)
        self.stream = sys.stderr if stream is None else stream
        self.ok = self.failed = 0
        self._start = self._last = time.monotonic()

    def line(self) -> str:
        """The current status line (without newline)."""
        done = self.ok + self.failed
        elapsed = time.monotonic() - self._start
        percent = 100.0 * done / self.total if self.total else 100.0
        eta = elapsed / done * (self.total - done) if done else 0.0
        return (f"{self.desc}: {done}/{self.total} ({percent:.1f}%) ok={self.ok} failed={self.failed} "
                f"elapsed {_clock(elapsed)} eta {_clock(eta)}")

    def update(self, ok: int, failed: int) -> None:
        """Counts ``ok`` succeeded and ``failed`` failed instances; prints if the interval has passed."""
        self.ok += ok
        self.failed += failed
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            print(self.line(), file=self.stream, flush=True)

    def close(self) -> None:
        """Prints the final line."""
        print(self.line(), file=self.stream, flush=True)


class TqdmProgress:
    """The same interface over a tqdm bar."""

    def __init__(self, total: int, desc: str = "run", stream=None):
        """``total`` instances to process; the bar goes to ``stream`` (default stderr)."""
        from tqdm.auto import tqdm  # noqa: PLC0415 - optional dependency

        self.ok = self.failed = 0
        self._bar = tqdm(total=int(total), desc=desc, unit="inst", file=stream, dynamic_ncols=True)

    def update(self, ok: int, failed: int) -> None:
        """Advances the bar by ``ok + failed`` and shows the failure count."""
        self.ok += ok
        self.failed += failed
        self._bar.set_postfix(failed=self.failed, refresh=False)
        self._bar.update(ok + failed)

    def close(self) -> None:
        """Closes the bar."""
        self._bar.close()


class NoProgress:
    """Counts silently."""

    def __init__(self, total: int = 0, desc: str = "run", stream=None):
        self.ok = self.failed = 0

    def update(self, ok: int, failed: int) -> None:
        """Counts only."""
        self.ok += ok
        self.failed += failed

    def close(self) -> None:
        """Does nothing."""


def check_progress_mode(mode: str) -> None:
    """Checks a progress mode before a run starts (so a missing tqdm stops nothing half-way).

    Raises:
      ValueError: unknown ``mode``, or ``"tqdm"`` without tqdm installed (the
        message says what to do).
    """
    if mode not in PROGRESS_MODES:
        raise ValueError(f"progress mode must be one of {PROGRESS_MODES}, got {mode!r}")
    if mode == "tqdm":
        try:
            import tqdm  # noqa: F401, PLC0415 - optional dependency
        except ImportError:
            raise ValueError("--progress tqdm needs the tqdm package (pip install tqdm); "
                             "use --progress auto or plain") from None


def make_progress(total: int, mode: str = "auto", desc: str = "run", stream=None):
    """A progress display for ``total`` instances.

    Args:
      total: number of instances this session will process.
      mode: ``"auto"`` (tqdm if importable, else plain), ``"tqdm"``, ``"plain"`` or ``"none"``.
      desc: label shown in front.
      stream: output stream (default stderr).

    Raises:
      ValueError: unknown ``mode``.
      ImportError: ``mode="tqdm"`` without tqdm installed.
    """
    if mode not in PROGRESS_MODES:
        raise ValueError(f"progress mode must be one of {PROGRESS_MODES}, got {mode!r}")
    if mode == "none":
        return NoProgress(total, desc, stream)
    if mode in ("auto", "tqdm"):
        try:
            return TqdmProgress(total, desc, stream)
        except ImportError:
            if mode == "tqdm":
                raise
    return PlainProgress(total, desc, stream)
