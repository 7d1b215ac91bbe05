"""Helpers of run.sh (standard library only, except ``env``, which imports the measured stack).

  python3 -u tools.py stamp                    stdin -> stdout, each line prefixed "[  12.3s] " (since start)
  python3 tools.py env                         GPU, versions, and whether JAX's float32 matmuls run as TF32
  python3 tools.py summarize STEP LOG RC WALL CAP [RUN_DIR]
                                               the compact summary of one step's log (printed)
  python3 tools.py cli-stats RUN_DIR           appended to a CLI step's log: timings.jsonl stats, records
  python3 tools.py table OUT                   ONE table, a row per step, from the step logs in OUT

Every number in the table is read from a step's log (`headline` of the step's kind); a step that
timed out still shows what its log holds. docs/benchmarking.md, "GPU suite".
"""

from __future__ import annotations

import json
import pathlib
import re
import statistics
import subprocess
import sys
import time

STEPS = ("env", "breps", "tetris", "grid", "sam", "cli_breps", "cli_tetris", "sam2_breps", "click_tetris",
         "rclicks_sam", "rclicks_ritm", "semseg_mem", "precision")
STAMP = re.compile(r"^\[\s*[0-9.]+s\] ")
STEP_END = re.compile(r"^# step (\S+): exit (\d+) after ([0-9.]+)s")
COMPILE = re.compile(r"Finished (XLA compilation of|tracing \+ transforming|jaxpr to MLIR module conversion) "
                     r"(\S+)(?: for pjit)? in ([0-9.]+) sec")
CACHE_HIT = re.compile(r"Persistent compilation cache hit for '([^']+)'")
JAX_NOISE = re.compile(r"Compiling |Finished (XLA|tracing|jaxpr)|[Pp]ersistent compilation cache|"
                       r"^WARNING:jax|^W\d{4} |^I\d{4} |Not writing persistent cache entry")
ERROR = re.compile(r"Traceback|Error|error:|Killed|CUDA_ERROR|RESOURCE_EXHAUSTED|out of memory", re.I)
VERDICTS = {"0": "ok", "124": "TIMEOUT", "137": "KILLED", "skipped": "SKIPPED"}
# the paper's cost of the RClicks benchmark: 2,400 A100-hours over 33 checkpoints
RCLICKS_PAPER_HOURS, RCLICKS_PAPER_CHECKPOINTS = 2400.0, 33

KEY_LINES = {
    "breps": r"^#.*(jax |sam|torch device)|^stage|^encoder|^attack loop|^ms per attack|^jax compile|^cross-check",
    "tetris": r"^# (sam_vit|jax backend|torch device)|^reference \(|^jaxseg_robust \(|^ratio reference|^sanity|"
              r"^final IoU",
    "grid": r"^# (SAM|embedding|jax backend|torch device)|^torch |^jax |^ratio \(best|^full grid 1024",
    "sam": r"^# (jax|torch device|repeats)|^sam_vit_b ",
    "click": r"^# (jax|image)|^(ritm_h18|simpleclick_vit_b) +tetris|^#   .* tetris (min|max)",
    "env": r"^(?!# (step|cmd))",
    "semseg_mem": r"^(?!# (step|cmd))",
    "precision": r"^# (jax backend|torch device|SAM)|^torch fp32|^precision ",
    "cli": r"^loading|^compiling|^note:|^warning:|^/.*instances: |^jaxseg-robust|^\S+: \d+/\d+ \(100",
}


def kind_of(step: str) -> str:
    """The parser a step's log needs: cli_* and rclicks_* are command-line runs, sam2_breps is breps."""
    if step.startswith(("cli_", "rclicks")):
        return "cli"
    return {"sam2_breps": "breps", "click_tetris": "click"}.get(step, step)


def stamp() -> int:
    start = time.time()
    while True:
        line = sys.stdin.readline()
        if not line:
            return 0
        sys.stdout.write(f"[{time.time() - start:7.1f}s] {line}")
        sys.stdout.flush()


def unstamped(raw: list[str]) -> list[str]:
    """The log's lines without their time stamps."""
    return [STAMP.sub("", line) for line in raw]


def stamp_of(line: str) -> float | None:
    """Seconds since the step started, from a stamped line (None for an unstamped one)."""
    found = re.match(r"^\[\s*([0-9.]+)s\] ", line)
    return float(found.group(1)) if found else None


def compile_summary(lines: list[str]) -> str:
    """The programs whose trace + lower + XLA compile took >= 1 s, longest first; cache hits counted."""
    totals: dict[str, float] = {}
    xla: dict[str, float] = {}
    for line in lines:
        match = COMPILE.search(line)
        if match:
            phase, name, seconds = match.group(1), match.group(2), float(match.group(3))
            totals[name] = totals.get(name, 0.0) + seconds
            if phase.startswith("XLA"):
                xla[name] = xla.get(name, 0.0) + seconds
    hits = sum(1 for line in lines if CACHE_HIT.search(line))
    big = sorted(((s, n) for n, s in totals.items() if s >= 1.0), reverse=True)
    text = ", ".join(f"{n} {s:.1f}s (xla {xla.get(n, 0.0):.1f}s)" for s, n in big[:6])
    return f"compiles >=1s (trace+lower+xla): {text or 'none'}; persistent-cache hits {hits}"


def compile_total(lines: list[str]) -> float:
    """Seconds of XLA compilation logged in the step."""
    return sum(float(m.group(3)) for m in map(COMPILE.search, lines) if m and m.group(1).startswith("XLA"))


# ---- the headline of each step kind: the numbers of its table row ---------------------------------

def _first(pattern: str, lines: list[str]):
    for line in lines:
        found = re.search(pattern, line)
        if found:
            return found
    return None


def _last(pattern: str, lines: list[str]):
    return _first(pattern, lines[::-1])


def headline_env(lines: list[str]) -> str:
    gpu = _first(r"^GPU 0: (.+?)(?: \(UUID|$)", lines)
    backend = _first(r"^jax backend ([a-z]+)", lines)
    tf32 = _first(r"default ([0-9.]+) ms, highest ([0-9.]+) ms, max\|default - highest\| / max\|highest\| "
                  r"([0-9.e+-]+)", lines)
    parts = [gpu.group(1) if gpu else f"backend {backend.group(1)}" if backend else "no device line"]
    if tf32:
        default_ms, highest_ms, rel = tf32.groups()
        parts.append(f"f32 matmul default {default_ms} ms vs highest {highest_ms} ms, rel. diff {rel}"
                     + (" (TF32-like)" if 1e-5 < float(rel) < 1e-2 else ""))
    return "; ".join(parts)


def headline_breps(lines: list[str]) -> str:
    rates = _first(r"instances/s \(attack loop\): torch ([0-9.]+), jax ([0-9.]+)", lines)
    batch = _first(r"jax [0-9.]+ \(batch (\d+)\)", lines)
    compiles = _first(r"jax compile .*: embed ([0-9.]+) s, attack ([0-9.]+) s", lines)
    check = _first(r"final MIN IoU \|diff\| mean ([0-9.e+-]+|nan) max ([0-9.e+-]+|nan)", lines)
    parts = []
    if rates:
        parts.append(f"attack inst/s torch {rates.group(1)}, jax {rates.group(2)}"
                     + (f" (batch {batch.group(1)})" if batch else "")
                     + (f" = {float(rates.group(2)) / float(rates.group(1)):.1f}x" if float(rates.group(1)) else ""))
    if compiles:
        parts.append(f"compile embed {compiles.group(1)} s + attack {compiles.group(2)} s")
    if check:
        parts.append(f"final IoU |diff| vs torch mean {check.group(1)} max {check.group(2)}")
    return "; ".join(parts)


def headline_tetris(lines: list[str]) -> str:
    ref = _first(r"^reference \(.*?\): ([0-9.]+) s/instance \(encoder ([0-9.]+) s, attack ([0-9.]+) s\)", lines)
    ours = _first(r"^jaxseg_robust \(batch (\d+).*?\): ([0-9.]+) s/instance end to end; apart: encoder ([0-9.]+) s "
                  r"\+ attack ([0-9.]+) s; first call incl. compile ([0-9.]+) s", lines)
    final = _first(r"^final IoU .*\|diff\| mean ([0-9.e+-]+|nan) max ([0-9.e+-]+|nan)", lines)
    parts = []
    if ref and float(ref.group(3)) > 0:
        parts.append(f"torch {1 / float(ref.group(1)):.3g} inst/s end to end ({1 / float(ref.group(3)):.3g} attack)")
    if ours and float(ours.group(4)) > 0:
        parts.append(f"jax {1 / float(ours.group(2)):.3g} inst/s end to end ({1 / float(ours.group(4)):.3g} attack, "
                     f"batch {ours.group(1)}); first call incl. compile {ours.group(5)} s")
    if final:
        parts.append(f"final IoU |diff| mean {final.group(1)} max {final.group(2)}")
    return "; ".join(parts)


def headline_grid(lines: list[str]) -> str:
    rates = [(m.group(1), float(m.group(2)), m.group(3)) for m in
             (re.match(r"(torch|jax)\s+[0-9.]+\s+([0-9.]+)\s+[0-9.]+\s+[0-9.]+\s+(batch \d+|chunk \d+)", line)
              for line in lines) if m and float(m.group(2)) > 0]
    parts = [f"{side} {label}: {rate:.0f} pos/s = {1024 * 1024 / rate:.1f} s per 1024x1024 grid"
             for side, rate, label in rates]
    agree = _first(r"IoU agrees \(\|diff\| <= 1e-5\) at ([0-9.]+) %", lines)
    if agree:
        parts.append(f"IoU agrees at {agree.group(1)} %")
    return "; ".join(parts)


def headline_sam(lines: list[str]) -> str:
    parts = []
    for line in lines:
        found = re.match(r"sam_vit_b\s+(encoder \S+|decode N=\d+)\s+([0-9.]+)\s+([0-9.]+)", line)
        if found:
            parts.append(f"{found.group(1)} torch {found.group(2)} ms, jax {found.group(3)} ms")
    return "; ".join(parts)


def headline_click(lines: list[str]) -> str:
    parts = []
    for line in lines:
        found = re.match(r"(ritm_h18|simpleclick_vit_b)\s+tetris\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)",
                         line)
        if found:
            parts.append(f"{found.group(1)} TETRIS inst/s torch {found.group(4)}, jax {found.group(5)}")
    return "; ".join(parts)


def headline_cli(lines: list[str], raw: list[str]) -> str:
    done = _last(r"instances: (\d+) ok, (\d+) failed", lines)
    stats = _last(r"seconds per instance \(batch wall / batch size, compile excluded\) mean ([0-9.]+)", lines)
    parts = []
    if done:
        parts.append(f"{done.group(1)} ok, {done.group(2)} failed")
    if stats:
        parts.append(f"{float(stats.group(1)):.3f} s/instance (compile excluded)")
    compiled = compile_total(lines)
    if compiled:
        parts.append(f"XLA compile {compiled:.1f} s")
    announced = [stamp_of(line) for line in raw if "compiling the" in line]
    if announced and announced[0] is not None:
        parts.append(f"start -> first compile {announced[0]:.1f} s")
    return "; ".join(parts)


def rclicks_projection(seconds_per_instance: float) -> str:
    """GPU hours of one checkpoint per 1,000 instances at this rate, and the paper's hours per checkpoint."""
    per_checkpoint = RCLICKS_PAPER_HOURS / RCLICKS_PAPER_CHECKPOINTS
    return (f"{seconds_per_instance * 1000 / 3600:.2f} GPU-h per 1,000 instances per checkpoint (paper: "
            f"{RCLICKS_PAPER_HOURS:.0f} A100-h / {RCLICKS_PAPER_CHECKPOINTS} checkpoints = {per_checkpoint:.1f} "
            "A100-h per checkpoint)")


def headline_semseg_mem(lines: list[str]) -> str:
    rows = [re.match(r"\| (\S+) \| (\d+) \| (\d+) \| ([0-9.]+) \|", line) for line in lines]
    rows = [r for r in rows if r]
    if not rows:
        return ""
    worst = max(rows, key=lambda r: float(r.group(4)))
    return (f"{len(rows)} programs; largest temp {float(worst.group(4)) / 1024:.2f} GiB ({worst.group(1)}, batch "
            f"{worst.group(2)}, {worst.group(3)} steps)")


def headline_precision(lines: list[str]) -> str:
    parts = []
    for line in lines:
        found = re.match(r"precision (\S+): breps attack ([0-9.]+) s/instance.*?final IoU vs torch fp32 \|diff\| mean "
                         r"([0-9.e+-]+|nan) max ([0-9.e+-]+|nan).*?grid ([0-9.]+) positions/s, IoU \|diff\| <= 1e-5 "
                         r"at ([0-9.]+) %", line)
        if found:
            name, attack, mean, top, grid, agree = found.groups()
            parts.append(f"{name}: breps {float(attack) * 1e3:.1f} ms/inst, IoU |diff| mean {mean} max {top}; grid "
                         f"{float(grid):.0f} pos/s, {agree} % agree")
    return "; ".join(parts)


HEADLINES = {"env": headline_env, "breps": headline_breps, "tetris": headline_tetris, "grid": headline_grid,
             "sam": headline_sam, "click": headline_click, "semseg_mem": headline_semseg_mem,
             "precision": headline_precision}


def headline(step: str, raw: list[str]) -> str:
    """The key numbers of one step's log (its table row's text); empty when the log holds none."""
    lines = unstamped(raw)
    kind = kind_of(step)
    if kind == "cli":
        text = headline_cli(lines, raw)
        stats = _last(r"seconds per instance \(batch wall / batch size, compile excluded\) mean ([0-9.]+)", lines)
        if step.startswith("rclicks") and stats:
            text += "; " + rclicks_projection(float(stats.group(1)))
        return text
    return HEADLINES[kind](lines) if kind in HEADLINES else ""


def step_result(raw: list[str]) -> tuple[str, str]:
    """(verdict, wall seconds) from a step log's last line (``# step NAME: exit RC after Ws``); ``NO LOG`` for
    no log, ``INCOMPLETE`` for a log without its end line (the suite itself was stopped)."""
    for line in raw[::-1]:
        found = STEP_END.match(line)
        if found:
            return VERDICTS.get(found.group(2), f"FAILED rc={found.group(2)}"), found.group(3)
        if line.startswith("skipped:"):
            return "SKIPPED", "0"
    return ("INCOMPLETE", "-") if raw else ("NO LOG", "-")


def table_rows(out: pathlib.Path) -> list[tuple[str, str, str, str]]:
    """(step, verdict, wall s, headline) of every step of `STEPS` in order (``NO LOG`` when it has none)."""
    rows = []
    for step in STEPS:
        path = out / f"{step}.log"
        raw = path.read_text(errors="replace").splitlines() if path.exists() else []
        verdict, wall = step_result(raw)
        rows.append((step, verdict, wall, headline(step, raw) if raw else ""))
    return rows


def table(out: str) -> int:
    """Prints the one table of the suite (Markdown)."""
    print("| step | result | wall s | headline |")
    print("|---|---|---|---|")
    for step, verdict, wall, text in table_rows(pathlib.Path(out)):
        print(f"| {step} | {verdict} | {wall} | {text.replace('|', '/') or '-'} |")
    return 0


# ---- per-step summaries ---------------------------------------------------------------------

def summarize(step: str, log: str, rc: str, wall: str, cap: str, run_dir: str | None = None) -> int:
    path = pathlib.Path(log)
    raw = path.read_text(errors="replace").splitlines() if path.exists() else []
    lines = unstamped(raw)
    kind = kind_of(step)
    verdict = VERDICTS.get(rc, f"FAILED rc={rc}")
    print(f"=== [{step}] {verdict}  wall {wall}s (cap {cap}s)  log {path.name}")
    pattern = re.compile(KEY_LINES.get(kind, r"^$"))
    shown = 0
    for stamped, line in zip(raw, lines):
        if not JAX_NOISE.search(line) and pattern.search(line) and shown < 24:
            print("  " + (stamped if kind == "cli" else line)[:400])
            shown += 1
    text = headline(step, raw)
    if text:
        print(f"  headline: {text}")
    if kind != "env":
        print("  " + compile_summary(lines))
    if rc not in ("0", "skipped"):
        errors = [line for line in lines if ERROR.search(line) and not JAX_NOISE.search(line)]
        tail = [line for line in lines if not JAX_NOISE.search(line)][-6:]
        for line in (errors[-4:] + ["-- last lines:"] + tail):
            print("  ! " + line[:400])
    if kind == "cli" and run_dir:
        cli_stats(run_dir, indent="  ")
    sys.stdout.flush()
    return 0


def cli_stats(run_dir: str, indent: str = "") -> int:
    from jaxseg_robust.reports.artifacts import read_timing_lines  # noqa: PLC0415

    run = pathlib.Path(run_dir)
    timings = read_timing_lines(run)  # a line cut off by a kill is skipped, as the run's own summary does
    if timings:
        seconds = [float(t["seconds"]) for t in timings]
        batches = sorted({round(float(t["batch_seconds"]), 3) for t in timings})
        print(f"{indent}timings.jsonl: {len(seconds)} instances; seconds per instance (batch wall / batch size, "
              f"compile excluded) mean {statistics.mean(seconds):.3f} median {statistics.median(seconds):.3f}; "
              f"batch calls {batches} s")
    else:
        print(f"{indent}timings.jsonl: none in {run}")
    ok = failed = 0
    for file in run.glob("records*.jsonl"):
        for line in file.read_text().splitlines():
            try:
                status = json.loads(line).get("status")
            except ValueError:
                continue
            ok += status == "ok"
            failed += status not in ("ok", None)
    print(f"{indent}records: {ok} ok, {failed} not ok")
    return 0


# ---- env ------------------------------------------------------------------------------------

ENV_SCRIPT = r'''
import sys, time
t0 = time.time()
import jax, jaxlib, flax, optax, numpy, torch, cv2, jaxseg_robust
print(f"python {sys.version.split()[0]}; jax {jax.__version__} jaxlib {jaxlib.__version__} flax {flax.__version__} "
      f"optax {optax.__version__} numpy {numpy.__version__} torch {torch.__version__} cv2 {cv2.__version__}; "
      f"jaxseg_robust from {jaxseg_robust.__file__.rsplit('/', 2)[0]}")
for name in ("torchvision", "segment_anything", "hydra", "iopath"):
    try:
        module = __import__(name)
        where = (getattr(module, "__file__", None) or list(getattr(module, "__path__", ["?"]))[0]).rsplit("/", 2)[0]
        print(f"{name} {getattr(module, '__version__', '?')} from {where}")
    except Exception as error:
        print(f"{name}: not importable ({type(error).__name__}: {error})")
print(f"jax backend {jax.default_backend()}: {jax.devices()}")
cuda = torch.cuda.is_available()
print(f"torch cuda {cuda}" + (f": {torch.cuda.get_device_name(0)}" if cuda else ""))
print(f"imports + device init {time.time() - t0:.1f} s")
import jax.numpy as jnp
n = 4096 if jax.default_backend() != "cpu" else 512
a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
def tim(f):
    f = jax.jit(f)
    jax.block_until_ready(f(a))
    t = time.perf_counter()
    r = jax.block_until_ready(f(a))
    return r, time.perf_counter() - t
d, td = tim(lambda x: x @ x)
h, th = tim(lambda x: jnp.matmul(x, x, precision="highest"))
print(f"jax f32 {n}^2 matmul: default {td * 1e3:.2f} ms, highest {th * 1e3:.2f} ms, max|default - highest| / "
      f"max|highest| {float(jnp.abs(d - h).max() / jnp.abs(h).max()):.1e} (~1e-4..1e-3 means TF32)")
print(f"torch: float32_matmul_precision={torch.get_float32_matmul_precision()} "
      f"cuda.matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32} "
      f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}")
'''


def env() -> int:
    """The GPU (nvidia-smi), the CPU load, and `ENV_SCRIPT` in this interpreter."""
    try:
        print(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout.strip())
        print(subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, check=False).stdout.strip())
    except FileNotFoundError:
        print("no nvidia-smi")
    with open("/proc/loadavg") as handle:
        print(f"load {' '.join(handle.read().split()[:3])}")
    return subprocess.run([sys.executable, "-c", ENV_SCRIPT], check=False).returncode


def main(argv: list[str]) -> int:
    if argv[:1] == ["stamp"]:
        return stamp()
    if argv[:1] == ["env"]:
        return env()
    if argv[:1] == ["summarize"] and len(argv) in (6, 7):
        return summarize(*argv[1:])
    if argv[:1] == ["cli-stats"] and len(argv) == 2:
        return cli_stats(argv[1])
    if argv[:1] == ["table"] and len(argv) == 2:
        return table(argv[1])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
