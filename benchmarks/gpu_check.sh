#!/usr/bin/env bash
# The GPU check of issue 46, in one command, on a machine with one CUDA GPU and this repository (~9 min):
#
#     bash benchmarks/gpu_check.sh [RESULTS.md]           # everything below; every figure goes to RESULTS.md
#     PYTHON=python3 bash benchmarks/gpu_check.sh ...      # a Python that already has a CUDA torch: no install
#     GPU_CHECK_CPU=1 bash benchmarks/gpu_check.sh ...     # the same steps with the GPU parts off (tried on a CPU)
#     CAPE_SIZES=125m NOTEBOOKS= bash benchmarks/gpu_check.sh ...   # a rerun: only the 125M table, no notebooks
#
# 1. install: .venv with a CUDA build of torch 2.13.0 and the package (kept if it is there already; TORCH=...
#    picks another requirement). With PYTHON=..., nothing is installed: that interpreter runs everything from this
#    checkout (PYTHONPATH), e.g. a GPU machine without network whose image has torch and the notebook tools.
# 2. a smoke test: two training steps on CUDA. If it fails, nothing else can work and the script stops there, so a
#    short lease is not spent on a row of identical failures.
# 3. the demo at its GPU budget starts in the background, printing each model's time as it finishes; it shares the
#    GPU with step 4 only, so its wall time is nearly its own
# 4. tests/test_gpu.py with MINIDAPE_EXPECT_GPU=1 (no GPU is an error, not a row of skips)
# 5. the demo is waited for (at most until 40 % of the time, or DEMO_LEAVES_SECONDS, is left; the file says whether it finished)
#    (the demo alone took about 9 min 10 s on one H200: within the default 9 min it is stopped; GPU_CHECK_SECONDS=1200 sees it end)
# 6. the GPU benchmarks, alone on the GPU: the base PE, DAPE and the 1x3 refiner at CAPE's Table 1 setting (forward
#    and backward apart, tokens/s, peak memory) for the tiny model and the papers' 125M model at T = 512; then each
#    bias encoding through FlexAttention and through SDPA on the 125M model
# 7. every notebook in quick mode (each picks CUDA by itself), under nbval with the figure rules, as CI runs them;
#    then, if STUDENT_DIR names a folder of student-edition .ipynb (`make test-notebooks` writes .nbtest-student/),
#    those too, with every exercise expected unsolved
# Each step has its own time limit; a failing step is recorded and the next one runs. The exit code is the
# number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=$(realpath -m "${1:-gpu_check_results.md}")
TOTAL=${GPU_CHECK_SECONDS:-540}
CPU_ONLY=${GPU_CHECK_CPU:-0}
NOTEBOOKS=${NOTEBOOKS-$(ls notebooks/[0-9][0-9]_*.py)}   # set and empty: no notebooks
CAPE_SIZES=${CAPE_SIZES:-tiny 125m}
if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # the checkout's package, in every child and kernel too
else
    PY=$PWD/.venv/bin/python   # absolute: the demo runs from its own folder
fi
DEVICE=$([ "$CPU_ONLY" = 1 ] && echo cpu || echo cuda)
START=$SECONDS
FAILED=0

section() { printf '\n## %s (at %d s)\n\n' "$1" "$((SECONDS - START))" | tee -a "$RESULTS"; }

# step LIMIT_SECONDS COMMAND...: run it, its output into the results file, its failure counted; returns its code
step() {
    local limit=$1
    shift
    echo "\$ $*" >> "$RESULTS"
    local began=$SECONDS
    timeout --kill-after=10 "$limit" "$@" > >(tee -a "$RESULTS") 2> >(tee -a "$RESULTS" >&2)
    local code=$?
    echo "($((SECONDS - began)) s)" >> "$RESULTS"
    if [ "$code" -ne 0 ]; then
        FAILED=$((FAILED + 1))
        echo "**step failed: exit code $code$([ "$code" -eq 124 ] && echo ", stopped after $limit s")**" | tee -a "$RESULTS"
    fi
    return "$code"
}

left() { echo $((TOTAL - (SECONDS - START))); }

{
    echo "# GPU check ($(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
    echo
    echo '```'
    nvidia-smi 2>/dev/null || echo "no nvidia-smi"
    echo '```'
    echo
    grep -m1 "model name" /proc/cpuinfo
    echo "CPU cores: $(nproc)"
    [ "$CPU_ONLY" = 1 ] && echo "GPU_CHECK_CPU=1: the GPU parts are off (a trial of this script on a CPU)"
} > "$RESULTS"

section "install"
if [ -n "${PYTHON:-}" ]; then
    echo "nothing installed: $PYTHON runs the checkout (PYTHONPATH=$PYTHONPATH)" | tee -a "$RESULTS"
elif [ "$CPU_ONLY" = 1 ]; then
    step 300 make .venv/.installed
elif ! [ -x "$PY" ] || ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    rm -rf .venv
    step 400 make .venv/.installed TORCH="${TORCH:-torch==2.13.0}"
fi
step 60 "$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'available:',
torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"

section "smoke test: two training steps on $DEVICE"
if ! step 90 env MINIDAPE_QUICK=1 "$PY" -c "
import time, minidape as md
clock = time.perf_counter()
cfg = md.GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=64, pe='kerple_log', refiner='dape')
_, history = md.train(cfg, 'austen', steps=2, batch_size=4, device='$DEVICE', progress=False, log_every=1)
print('trained two steps on $DEVICE in', round(time.perf_counter() - clock, 1), 's; losses', [round(h['loss'], 3) for h in history])
"; then
    section "stopped: the smoke test failed, so nothing else was tried"
    exit "$FAILED"
fi

section "demo at its GPU budget: started in the background"
demo_out=$(mktemp -d)
demo_log=$(mktemp)
if [ "$CPU_ONLY" = 1 ]; then
    (cd "$demo_out" && MINIDAPE_QUICK=1 "$PY" -m minidape demo --out run --device cpu) > "$demo_log" 2>&1 &
else
    (cd "$demo_out" && "$PY" -m minidape demo --out run --device cuda) > "$demo_log" 2>&1 &
fi
demo_pid=$!
demo_began=$SECONDS

section "tests/test_gpu.py"
if [ "$CPU_ONLY" = 1 ]; then
    step 300 env OMP_NUM_THREADS=1 "$PY" -m pytest -q -rs -p no:cacheprovider tests/test_gpu.py
else
    step "${TESTS_SECONDS:-150}" env MINIDAPE_EXPECT_GPU=1 "$PY" -m pytest -q -rsf --durations=8 -p no:cacheprovider tests/test_gpu.py
fi

section "demo at its GPU budget: waited for"
while kill -0 "$demo_pid" 2>/dev/null && [ "$(left)" -gt "${DEMO_LEAVES_SECONDS:-$((TOTAL * 2 / 5))}" ]; do sleep 2; done
if kill -0 "$demo_pid" 2>/dev/null; then
    kill -- "$demo_pid" 2>/dev/null; pkill -f "minidape demo --out run" 2>/dev/null
    FAILED=$((FAILED + 1))
    echo "**the demo did not finish: stopped after $((SECONDS - demo_began)) s (the rest of this check's time is for the benchmarks and notebooks)**" \
        | tee -a "$RESULTS"
else
    wait "$demo_pid"
    code=$?
    echo "the demo ended with exit code $code after $((SECONDS - demo_began)) s" | tee -a "$RESULTS"
    [ "$code" -ne 0 ] && FAILED=$((FAILED + 1))
fi
echo '```' >> "$RESULTS"
tr '\r' '\n' < "$demo_log" | grep -v '^\s*$' | grep -v -E ': +[0-9]{1,2}%\|' >> "$RESULTS"   # not tqdm's redraws
echo '```' >> "$RESULTS"
[ -f "$demo_out/run/results.md" ] && cat "$demo_out/run/results.md" >> "$RESULTS"
rm -rf "$demo_out" "$demo_log"

section "benchmarks (alone on the GPU)"
if [ "$CPU_ONLY" = 1 ]; then        # the same entry points, small, on the CPU (no FlexAttention there)
    step 300 "$PY" -m minidape bench --cape-table --no-memory --quick --length 64 --batch 2
else
    # CAPE's Table 1 first (the issue's comparison), then FlexAttention against SDPA for every bias encoding
    step 100 "$PY" -m minidape bench --device cuda --cape-table --size $CAPE_SIZES --length 512 --batch 8 --repeats 10
    step "${BIAS_SECONDS:-90}" "$PY" -m minidape bench --device cuda --bias-table --size 125m --length 512 --repeats 5
fi

if [ -n "$NOTEBOOKS" ]; then
    section "notebooks in quick mode"
    rm -rf .nbtest-gpu && mkdir -p .nbtest-gpu
    for f in $NOTEBOOKS; do
        out=.nbtest-gpu/$(basename "${f%.py}").ipynb
        cp "${f%.py}.ipynb" "$out" && "$PY" -m jupytext --quiet --update --to ipynb -o "$out" "$f"
    done
    limit=$(( $(left) > 300 ? ${NOTEBOOK_SECONDS:-150} : $(left) / 2 ))
    step "$limit" env MINIDAPE_QUICK=1 MINIDAPE_EXPECT_EXERCISES=all MINIDAPE_CHECK_FIGURES=1 \
        "$PY" -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env .nbtest-gpu
    rm -rf .nbtest-gpu
fi

if [ -n "${STUDENT_DIR:-}" ] && [ "$(left)" -gt 20 ]; then
    section "student edition in quick mode ($STUDENT_DIR)"
    step $(( $(left) - 10 )) env MINIDAPE_QUICK=1 MINIDAPE_EXPECT_EXERCISES=none MINIDAPE_CHECK_FIGURES=1 \
        "$PY" -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env "$STUDENT_DIR"
fi

section "done: $FAILED failed step(s) in $((SECONDS - START)) s"
exit "$FAILED"
