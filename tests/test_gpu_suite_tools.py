"""The GPU suite's log reading (experiments/gpu_suite/tools.py): each step's headline and the one table.

The log lines are the benchmark scripts' own output formats (stamped as run.sh stamps them)."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

SUITE = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "gpu_suite"


@pytest.fixture(scope="module")
def tools():
    spec = importlib.util.spec_from_file_location("gpu_suite_tools", SUITE / "tools.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stamped(lines, start=1.0):
    return [f"[{start + i:7.1f}s] {line}" for i, line in enumerate(lines)]


def write_log(out: pathlib.Path, step: str, lines, rc=0, wall=12.5):
    body = [f"# step {step}: timeout 45s (cap 45s), started 10:00:00 UTC", "# cmd: python x.py",
            *stamped(lines), f"# step {step}: exit {rc} after {wall}s"]
    (out / f"{step}.log").write_text("\n".join(body) + "\n")


BREPS = ["ms per attack: torch 250.0, jax 5.0 (batch 64); instances/s (attack loop): torch 4.000, jax 200.000",
         "jax compile (incl. first run, not in the numbers above): embed 9.5 s, attack 21.0 s",
         "cross-check over 4 instances: max |tight-box selection IoU diff| 0; final MIN IoU |diff| mean 0.00125 "
         "max 0.005 (a large value can be legitimate: ...)"]
TETRIS = ["reference (torch cuda, one instance and mode at a time, first 1 instances): 5.00 s/instance "
          "(encoder 1.00 s, attack 4.00 s)",
          "jaxseg_robust (batch 16, one jit call per batch, precision default): 0.50 s/instance end to end; apart: "
          "encoder 0.10 s + attack 0.25 s; first call incl. compile 140.2 s; traces 1",
          "final IoU (last click) vs torch over 2 trajectories (precision default): |diff| mean 0.01 max 0.02; "
          "torch [0.5, 0.6] ours [0.51, 0.62]"]
GRID = ["torch      2.00   2048.0     2.10   1.00  batch 256 (cuda)",
        "jax        0.50   8192.0     0.55   4.00  chunk 256, precision default; cpu-time ratio 3.8; first call 12.0 s "
        "(compile + run); IoU agrees (|diff| <= 1e-5) at 99.5 % of positions, BIoU at 99.0 %, max |IoU diff| 0.3"]
PRECISION = [f"precision {name}: breps attack {attack} s/instance (batch 16), encoder 0.0100 s/image; final IoU vs "
             f"torch fp32 |diff| mean {mean} max {top} over 4; tight-box IoU max |diff| 0; grid {grid} positions/s, "
             f"IoU |diff| <= 1e-5 at {agree} % of 1024, max |diff| 0.1 (20.0 s with compiles)"
             for name, attack, mean, top, grid, agree in (("highest", "0.0200", "0", "0", "1000.0", "100.0"),
                                                          ("default", "0.0050", "0.003", "0.01", "4000.0", "97.5"))]


def test_breps_headline_reads_rates_compiles_and_the_cross_check(tools):
    text = tools.headline("breps", stamped(BREPS))
    assert "attack inst/s torch 4.000, jax 200.000 (batch 64) = 50.0x" in text
    assert "compile embed 9.5 s + attack 21.0 s" in text
    assert "final IoU |diff| vs torch mean 0.00125 max 0.005" in text
    assert tools.headline("sam2_breps", stamped(BREPS)) == text  # SAM 2 BREPS prints the same lines


def test_tetris_headline_turns_seconds_into_instances_per_second(tools):
    text = tools.headline("tetris", stamped(TETRIS))
    assert "torch 0.2 inst/s end to end (0.25 attack)" in text
    assert "jax 2 inst/s end to end (4 attack, batch 16); first call incl. compile 140.2 s" in text
    assert "final IoU |diff| mean 0.01 max 0.02" in text


def test_grid_headline_extrapolates_the_full_1024_grid(tools):
    text = tools.headline("grid", stamped(GRID))
    assert f"torch batch 256: 2048 pos/s = {1024 * 1024 / 2048:.1f} s per 1024x1024 grid" in text
    assert f"jax chunk 256: 8192 pos/s = {1024 * 1024 / 8192:.1f} s per 1024x1024 grid" in text
    assert "IoU agrees at 99.5 %" in text


def test_precision_headline_has_one_entry_per_precision(tools):
    text = tools.headline("precision", stamped(PRECISION))
    assert text.startswith("highest: ") and text.count("ms/inst") == 2
    assert "highest: breps 20.0 ms/inst, IoU |diff| mean 0 max 0; grid 1000 pos/s, 100.0 % agree" in text
    assert "default: breps 5.0 ms/inst, IoU |diff| mean 0.003 max 0.01; grid 4000 pos/s, 97.5 % agree" in text


def test_click_model_headline_reads_both_models_tetris_rows(tools):
    lines = ["ritm_h18           tetris     254609.6    13078.4     0.004     0.076   19.47  jax first call 76.6 s",
             "simpleclick_vit_b  tetris     123289.5    35173.4     0.008     0.028    3.51  jax first call 63.2 s"]
    assert tools.headline("click_tetris", stamped(lines)) == ("ritm_h18 TETRIS inst/s torch 0.004, jax 0.076; "
                                                            "simpleclick_vit_b TETRIS inst/s torch 0.008, jax 0.028")


def test_cli_and_rclicks_headlines(tools):
    lines = ["loading sam_vit_b ...", "compiling the RClicks program for bucket 512x896, batch 16 (first batch) ...",
             "Finished XLA compilation of jit(_run) in 30.5 sec",
             "/tmp/run: 16 instances: 16 ok, 0 failed in 80.0 s",
             "timings.jsonl: 16 instances; seconds per instance (batch wall / batch size, compile excluded) mean "
             "1.800 median 1.750; batch calls [28.8] s"]
    raw = stamped(lines)
    cli = tools.headline("cli_tetris", raw)
    assert cli == ("16 ok, 0 failed; 1.800 s/instance (compile excluded); XLA compile 30.5 s; "
                   "start -> first compile 2.0 s")
    rclicks = tools.headline("rclicks_sam", raw)
    assert rclicks.startswith(cli + "; 0.50 GPU-h per 1,000 instances per checkpoint")
    assert "2400 A100-h / 33 checkpoints = 72.7 A100-h per checkpoint" in rclicks


def test_semseg_memory_headline_names_the_largest_program(tools):
    lines = ["| program | batch | steps | temp MiB | args MiB | out MiB |", "|---|---|---|---|---|---|",
             "| value_and_grad | 1 | 1 | 512.0 | 10.0 | 1.0 |", "| sea | 4 | 2 | 4096.0 | 10.0 | 1.0 |"]
    assert tools.headline("semseg_mem", stamped(lines)) == "2 programs; largest temp 4.00 GiB (sea, batch 4, 2 steps)"


def test_the_table_has_every_step_in_order_with_its_result(tools, tmp_path):
    write_log(tmp_path, "breps", BREPS)
    write_log(tmp_path, "tetris", TETRIS[:1], rc=124, wall=85.0)
    (tmp_path / "grid.log").write_text("skipped: only 3s left of TOTAL_S=470\n")
    (tmp_path / "sam.log").write_text("# step sam: timeout 25s (cap 25s), started 10:00:00 UTC\n")
    rows = {step: rest for step, *rest in tools.table_rows(tmp_path)}
    assert list(rows) == list(tools.STEPS)
    assert rows["breps"][:2] == ["ok", "12.5"] and "jax 200.000" in rows["breps"][2]
    assert rows["tetris"][:2] == ["TIMEOUT", "85.0"] and rows["tetris"][2].startswith("torch 0.2 inst/s")
    assert rows["grid"] == ["SKIPPED", "0", ""]
    assert rows["sam"] == ["INCOMPLETE", "-", ""]  # the suite was stopped inside the step
    assert rows["cli_breps"] == ["NO LOG", "-", ""]


def test_table_prints_one_markdown_table(tools, tmp_path, capsys):
    write_log(tmp_path, "precision", PRECISION)
    assert tools.main(["table", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| step | result | wall s | headline |" and len(lines) == 2 + len(tools.STEPS)
    (row,) = [line for line in lines if line.startswith("| precision |")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[:3] == ["precision", "ok", "12.5"] and "97.5 % agree" in cells[3]


def test_the_scripts_run_sh_calls_take_the_flags_it_passes():
    """Every --flag run.sh passes to a benchmark script is defined by that script's parser."""
    import re

    text = (SUITE / "run.sh").read_text()
    bench = SUITE.parents[0] / "benchmarks"
    calls = {"bench_breps.py": ["BREPS_ARGS", "SAM2_ARGS"], "bench_tetris.py": ["TETRIS_ARGS"],
             "bench_grid.py": ["GRID_ARGS"], "bench_sam.py": ["SAM_ARGS"], "bench_click_models.py": ["CLICK_ARGS"],
             "semseg_battery_memory.py": ["MEM_ARGS"], "bench_precision.py": ["PREC_ARGS"]}
    sources = {name: (bench / name).read_text() + (bench / "bench_device.py").read_text() for name in calls}
    for name, arrays in calls.items():
        flags = set()
        for array in arrays:
            for found in re.finditer(rf"{array}=\(([^)]*)\)", text):
                flags |= set(re.findall(r"(--[a-z0-9-]+)", found.group(1)))
        for line in text.replace("\\\n", " ").splitlines():  # continuation lines joined
            if f"$BENCH/{name}" in line:
                flags |= set(re.findall(r"(--[a-z0-9-]+)", line))
        assert flags, name
        for flag in flags:
            assert f'"{flag}"' in sources[name], f"{name} has no {flag}"
