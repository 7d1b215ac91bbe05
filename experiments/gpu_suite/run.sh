#!/usr/bin/env bash
# The GPU suite of jaxseg_robust: every headline GPU row in one call on one NVIDIA GPU (README.md here).
#
#   bash experiments/gpu_suite/prepare.sh                          # once, on the build machine: makes .gpu/
#   OUT="$OUT" bash experiments/gpu_suite/run.sh                   # on the GPU machine, from the project root
#   SMOKE=1 JAX_PLATFORMS=cpu bash experiments/gpu_suite/run.sh    # toy sizes, torch on the CPU: every step runs
#
# Steps, in priority order, each under `timeout` min(its cap, time left); the next runs whatever happened:
#   env, breps, tetris, grid, sam, cli_breps, cli_tetris, sam2_breps, click_tetris, rclicks_sam, rclicks_ritm,
#   semseg_mem, precision
# Each step's output (time-stamped) goes to $OUT/<step>.log; tools.py summarises each step and prints ONE
# table of every row at the end ($OUT/summary.txt holds the summaries and the table). Steps stop being
# started at TOTAL_S seconds (default 470; SMOKE=1: 7200).
#
# Environment knobs: OUT (default /tmp/jaxseg_gpu_out), TOTAL_S, SMOKE, PY (python, default python3),
# PAYLOAD (what prepare.sh made, default <project>/.gpu), SITE (wheel target), EXTRA_PYTHONPATH,
# TETRIS_BATCH (default 16), CLI_FRAME (default fixed:512x896), RUNS (the CLI steps' run directories,
# default /tmp/jaxseg_gpu_runs), ONLY (space-separated step names: run just those, e.g. to rerun one).

set -u
SUITE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROJ="${PROJ:-$(cd "$SUITE_DIR/../.." && pwd)}"
BENCH="$PROJ/experiments/benchmarks"
TOOLS="$SUITE_DIR/tools.py"
SMOKE="${SMOKE:-0}"
PY="${PY:-python3}"
OUT="${OUT:-/tmp/jaxseg_gpu_out}"
TOTAL_S="${TOTAL_S:-$([ "${SMOKE:-0}" = 1 ] && echo 7200 || echo 470)}"
PAYLOAD="${PAYLOAD:-$PROJ/.gpu}"
RUNS="${RUNS:-/tmp/jaxseg_gpu_runs}"
START=$(date +%s)
DEADLINE=$((START + TOTAL_S))
mkdir -p "$OUT" "$RUNS"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"

say() { echo "$*" | tee -a "$SUMMARY"; }

if [ ! -d "$PAYLOAD/real" ]; then
  say "# no payload at $PAYLOAD: run bash experiments/gpu_suite/prepare.sh first (wheels, references, images)"
fi

# ---- Python path: the carried wheels, the project, the carried reference checkouts ----------------
if [ "$SMOKE" = 1 ]; then SITE="${SITE:-/tmp/jaxseg_gpu_smoke_site}"; else SITE="${SITE:-/tmp/jaxseg_gpu_site}"; fi
if compgen -G "$PAYLOAD/.whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$PAYLOAD"/.whl/*.whl 2>&1 | grep -v -i "warning" | tail -3
fi
export PYTHONPATH="$SITE:$PROJ${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}"
if [ "$SMOKE" = 1 ] && ! "$PY" -c "import torchvision" >/dev/null 2>&1; then
  export PYTHONPATH="$PYTHONPATH:$SUITE_DIR/smoke_shim"   # torchvision's pure-Python package (smoke_shim/)
fi
export JAXSEG_SAM2_REPO="${JAXSEG_SAM2_REPO:-$PAYLOAD/ref/sam2}"
export JAXSEG_RITM_REPO="${JAXSEG_RITM_REPO:-$PAYLOAD/ref/ritm}"
export JAXSEG_SIMPLECLICK_REPO="${JAXSEG_SIMPLECLICK_REPO:-$PAYLOAD/ref/simpleclick}"

# ---- environment shared by every step --------------------------------------------------------
export PYTHONUNBUFFERED=1
export TF_CPP_MIN_LOG_LEVEL=1
# torch and JAX share the GPU inside each benchmark process: JAX preallocates this fraction and
# torch's caching allocator takes what it needs from the rest.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.70}"
export JAX_LOG_COMPILES=1          # "Finished XLA compilation of ... in X sec": compile seconds per program
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-/tmp/jaxseg_gpu_jax_cache}"
export MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824
if [ "$SMOKE" = 1 ]; then
  export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
  export PYTHONDONTWRITEBYTECODE=1
  TD=cpu
else
  TD=cuda
fi

# run_step NAME CAP_S CMD...: CMD under timeout min(CAP_S, time left), output stamped into $OUT/NAME.log,
# then the step's summary (tools.py summarize). Steps with < 15 s left are skipped.
run_step() {
  local name="$1" cap="$2"; shift 2
  local now left limit rc t0 t1 wall
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi   # ONLY="a b": just those steps
  now=$(date +%s); left=$((DEADLINE - now - 5)); limit=$cap
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 15 ]; then
    echo "skipped: only ${left}s left of TOTAL_S=${TOTAL_S}" >"$OUT/$name.log"
    "$PY" "$TOOLS" summarize "$name" "$OUT/$name.log" skipped 0 "$cap" | tee -a "$SUMMARY"
    return
  fi
  t0=$(date +%s.%N)
  { echo "# step $name: timeout ${limit}s (cap ${cap}s), started $(date -u +%H:%M:%S) UTC"; echo "# cmd: $*"; } \
      >"$OUT/$name.log"
  timeout -k 5 "$limit" "$@" 2>&1 | "$PY" -u "$TOOLS" stamp >>"$OUT/$name.log"
  rc=${PIPESTATUS[0]}
  t1=$(date +%s.%N)
  wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  echo "# step $name: exit $rc after ${wall}s" >>"$OUT/$name.log"
  if [ -n "${STEP_RUN_DIR:-}" ] && [ -d "$STEP_RUN_DIR" ]; then
    "$PY" "$TOOLS" cli-stats "$STEP_RUN_DIR" >>"$OUT/$name.log" 2>&1
  fi
  "$PY" "$TOOLS" summarize "$name" "$OUT/$name.log" "$rc" "$wall" "$limit" ${STEP_RUN_DIR:-} | tee -a "$SUMMARY"
}

# ---- sizes: the device run, or the CPU smoke run ---------------------------------------------
TB="${TETRIS_BATCH:-16}"
CLI_FRAME="${CLI_FRAME:-fixed:512x896}"   # one bucket for DAVIS 480x854 and Berkeley 321x481 / 481x321
if [ "$SMOKE" = 1 ]; then
  CAP_ENV=120 CAP_BREPS=600 CAP_TETRIS=900 CAP_GRID=600 CAP_SAM=600 CAP_CLI_B=900 CAP_CLI_T=1200 CAP_SAM2=900
  CAP_CLICK=1200 CAP_RCLICKS=1200 CAP_MEM=300 CAP_PREC=900
  BREPS_ARGS=(--instances 2 --torch-instances 1 --size 48 64 --steps 2)
  TETRIS_ARGS=(--instances 2 --batch 2 --torch-instances 1 --size 64 --clicks 2 --steps 2)
  GRID_ARGS=(--image-hw 48 64 --positions 16 --torch-batch 8 --chunk 4 8 --repeats 1)
  SAM_ARGS=(--prompts 1 4 --chunk 4 --repeats 1 --image-hw 48 64)
  CLI_DATA=(--limit 1 --batch-size 2)
  CLI_B_ARGS=(--n_opt_steps 2)
  CLI_T_ARGS=(--n-clicks 2 --n_opt_steps 2 --baseline-clicks 2)
  SAM2_ARGS=(--instances 2 --torch-instances 1 --size 48 64 --steps 2)
  CLICK_ARGS=(--batch-size 1 --ref-instances 1 --tetris-clicks 2 --tetris-iterates 2 --tetris-repeats 0 --repeats 1)
  RCLICKS_ARGS=(--n-clicks 2 --groups 2 --plot-groups 0)
  MEM_ARGS=(--size 33,41 --batches 1 --steps 2 --blocks 1,1,1,1)
  PREC_ARGS=(--instances 2 --torch-instances 1 --size 48 64 --steps 2 --positions 16 --chunk 4 --torch-batch 8)
else
  CAP_ENV=15 CAP_BREPS=45 CAP_TETRIS=85 CAP_GRID=30 CAP_SAM=25 CAP_CLI_B=35 CAP_CLI_T=50 CAP_SAM2=35
  CAP_CLICK=40 CAP_RCLICKS=25 CAP_MEM=20 CAP_PREC=45
  BREPS_ARGS=(--instances 64 --torch-instances 4 --size 480 640 --steps 50)
  TETRIS_ARGS=(--instances "$TB" --batch "$TB" --torch-instances 1 --size 640 --clicks 10 --steps 11)
  GRID_ARGS=(--image-hw 1024 1024 --positions 4096 --torch-batch 256 --chunk 256 --repeats 1)
  SAM_ARGS=(--prompts 1 64 256 --chunk 256 --repeats 2)
  CLI_DATA=(--batch-size 16)
  CLI_B_ARGS=()
  CLI_T_ARGS=()
  SAM2_ARGS=(--instances 32 --torch-instances 2 --size 480 640 --steps 50)
  CLICK_ARGS=(--batch-size 8 --ref-instances 1 --tetris-repeats 0 --repeats 1)
  RCLICKS_ARGS=(--plot-groups 0)
  MEM_ARGS=(--size 512,682 --batches 1,4 --steps 2)
  PREC_ARGS=(--instances 16 --torch-instances 4 --size 480 640 --steps 50 --positions 1024 --chunk 256
             --torch-batch 256)
fi

say "# jaxseg_robust GPU suite: SMOKE=$SMOKE TOTAL_S=$TOTAL_S OUT=$OUT  $(date -u '+%Y-%m-%d %H:%M:%S') UTC"

# 0. env: GPU, versions, whether JAX's default float32 matmuls run as TF32 -------------------------
run_step env "$CAP_ENV" "$PY" "$TOOLS" env

# 1. BREPS SAM ViT-B: our batch in one jitted call vs the reference one instance at a time ----------
run_step breps "$CAP_BREPS" "$PY" "$BENCH/bench_breps.py" --torch-device "$TD" "${BREPS_ARGS[@]}"

# 2. TETRIS SAM ViT-B, 10 clicks x 11 iterates, MIN + MAX ------------------------------------------
run_step tetris "$CAP_TETRIS" "$PY" "$BENCH/bench_tetris.py" --torch-device "$TD" "${TETRIS_ARGS[@]}"

# 3. click grid: positions/s of both sides, the full 1024 x 1024 grid extrapolated --------------------
run_step grid "$CAP_GRID" "$PY" "$BENCH/bench_grid.py" --torch-device "$TD" "${GRID_ARGS[@]}"

# 4. SAM encoder and batched decode --------------------------------------------------------------------
run_step sam "$CAP_SAM" "$PY" "$BENCH/bench_sam.py" --torch-device "$TD" --models sam_vit_b "${SAM_ARGS[@]}"

# 5. the command line as a user runs it: random-weight SAM ViT-B on 8 DAVIS + 8 Berkeley images -------
CLI=("$PY" -m jaxseg_robust.cli)
CLI_COMMON=(--random-weights 0 --datasets davis,berkeley --data-root "$PAYLOAD/real" --progress plain
            "${CLI_DATA[@]}")
rm -rf "${RUNS:?}"/cli_* "${RUNS:?}"/rclicks_*
STEP_RUN_DIR="$RUNS/cli_breps" run_step cli_breps "$CAP_CLI_B" \
    "${CLI[@]}" breps --model sam_vit_b "${CLI_COMMON[@]}" --frame "$CLI_FRAME" \
    ${CLI_B_ARGS[@]+"${CLI_B_ARGS[@]}"} --out "$RUNS/cli_breps"
STEP_RUN_DIR="$RUNS/cli_tetris" run_step cli_tetris "$CAP_CLI_T" \
    "${CLI[@]}" tetris --model sam_vit_b "${CLI_COMMON[@]}" --frame "$CLI_FRAME" \
    ${CLI_T_ARGS[@]+"${CLI_T_ARGS[@]}"} --out "$RUNS/cli_tetris"

# 6. SAM 2.1 Hiera-T BREPS against the official sam2 code (carried in $PAYLOAD/ref/sam2) ---------------
run_step sam2_breps "$CAP_SAM2" "$PY" "$BENCH/bench_breps.py" --family sam2 --model sam2.1_hiera_tiny \
    --torch-device "$TD" "${SAM2_ARGS[@]}"

# 7. RITM-H18 and SimpleClick ViT-B TETRIS through the authors' predictor (checkouts in $PAYLOAD/ref) --
JAXSEG_REAL_DATA="$PAYLOAD/real" run_step click_tetris "$CAP_CLICK" "$PY" "$BENCH/bench_click_models.py" \
    --models ritm_h18 simpleclick_vit_b --stages tetris --torch-device "$TD" "${CLICK_ARGS[@]}"

# 8. RClicks per checkpoint: SAM ViT-B and RITM-H18 with the clickability network (random weights); RITM on
#    Berkeley only: the authors' predictor zooms DAVIS to another size, and one run has one size
CLI_DATA_ONLY=(--random-weights 0 --data-root "$PAYLOAD/real" --progress plain "${CLI_DATA[@]}")
for entry in "sam_vit_b davis,berkeley" "ritm_hrnet18_cocolvis berkeley"; do
  model=${entry%% *}; datasets=${entry#* }
  STEP_RUN_DIR="$RUNS/rclicks_$model" run_step "rclicks_${model%%_*}" "$CAP_RCLICKS" \
      "${CLI[@]}" rclicks --model "$model" --clickability rclicks_clickability --clickability-random-weights 0 \
      --datasets "$datasets" "${CLI_DATA_ONLY[@]}" --frame "$CLI_FRAME" "${RCLICKS_ARGS[@]}" \
      --out "$RUNS/rclicks_$model"
done

# 9. the perturbation battery's compiled GPU memory (compile only) ----------------------------------
run_step semseg_mem "$CAP_MEM" "$PY" "$BENCH/semseg_battery_memory.py" "${MEM_ARGS[@]}"

# 10. matmul precision: speed and distance to torch float32 at highest / high / default ------------
run_step precision "$CAP_PREC" "$PY" "$BENCH/bench_precision.py" --torch-device "$TD" "${PREC_ARGS[@]}"

say ""
"$PY" "$TOOLS" table "$OUT" | tee -a "$SUMMARY"
say "# total wall $(( $(date +%s) - START ))s of TOTAL_S=${TOTAL_S}; logs: $(cd "$OUT" && ls | tr '\n' ' ')"
