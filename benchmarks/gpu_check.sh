#!/usr/bin/env bash
# The GPU check of issue 35, in one command, on a machine with one CUDA GPU and this repository (~12 min):
#
#     bash benchmarks/gpu_check.sh [RESULTS.md]        # everything below; every figure goes to RESULTS.md
#     GPU_CHECK_CPU=1 bash benchmarks/gpu_check.sh     # the same steps with the GPU parts off (tried on a CPU)
#
# 1. install: .venv with a CUDA build of torch 2.13.0 and the package (kept if it is there already; TORCH=...
#    picks another requirement, e.g. a local wheel on a machine without network)
# 2. tests/test_gpu.py with MINIDAPE_EXPECT_GPU=1 (no GPU is an error, not a row of skips)
# 3. the GPU benchmarks: each bias encoding through FlexAttention and SDPA against no bias, and the refiners
#    against their base encoding (CAPE's Table 1 setting), both on the papers' 125M model at T = 512
# 4. every notebook in quick mode (each picks CUDA by itself), under nbval as CI runs them
# 5. the demo at its GPU budget, with the time left of the 12 minutes (the file says whether it finished)
# Each step has its own time limit; a failing step is recorded and the next one runs. The exit code is the
# number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=$(realpath -m "${1:-gpu_check_results.md}")
TOTAL=${GPU_CHECK_SECONDS:-720}
CPU_ONLY=${GPU_CHECK_CPU:-0}
NOTEBOOKS=${NOTEBOOKS:-$(ls notebooks/[0-9][0-9]_*.py)}
PY=.venv/bin/python
START=$SECONDS
FAILED=0

section() { printf '\n## %s (at %d s)\n\n' "$1" "$((SECONDS - START))" | tee -a "$RESULTS"; }

# step LIMIT_SECONDS COMMAND...: run it, its output into the results file, its failure counted
step() {
    local limit=$1
    shift
    echo "\$ $*" >> "$RESULTS"
    timeout --kill-after=10 "$limit" "$@" > >(tee -a "$RESULTS") 2> >(tee -a "$RESULTS" >&2)
    local code=$?
    if [ "$code" -ne 0 ]; then
        FAILED=$((FAILED + 1))
        echo "**step failed: exit code $code$([ "$code" -eq 124 ] && echo ", stopped after $limit s")**" | tee -a "$RESULTS"
    fi
    return 0
}

left() { echo $((TOTAL - (SECONDS - START))); }

{
    echo "# GPU check ($(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
    echo
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
    grep -m1 "model name" /proc/cpuinfo
    [ "$CPU_ONLY" = 1 ] && echo "GPU_CHECK_CPU=1: the GPU parts are off (a trial of this script on a CPU)"
} > "$RESULTS"

section "install"
if [ "$CPU_ONLY" = 1 ]; then
    step 300 make .venv/.installed
elif ! [ -x "$PY" ] || ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    rm -rf .venv
    step 400 make .venv/.installed TORCH="${TORCH:-torch==2.13.0}"
fi
step 60 "$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'available:',
torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"

section "tests/test_gpu.py"
if [ "$CPU_ONLY" = 1 ]; then
    step 300 env OMP_NUM_THREADS=1 "$PY" -m pytest -q -rs tests/test_gpu.py
else
    step 240 env MINIDAPE_EXPECT_GPU=1 "$PY" -m pytest -q -rs tests/test_gpu.py
fi

section "benchmarks"
if [ "$CPU_ONLY" = 1 ]; then        # the same entry points, small, on the CPU (no FlexAttention there)
    step 300 "$PY" -m minidape bench --cape-table --no-memory --quick --length 64 --batch 2
else
    step 120 "$PY" -m minidape bench --device cuda --size 125m --bias-table --length 512 --repeats 10
    step 120 "$PY" -m minidape bench --device cuda --size 125m --cape-table --length 512 --batch 8 --repeats 10
fi

section "notebooks in quick mode"
rm -rf .nbtest-gpu && mkdir -p .nbtest-gpu
for f in $NOTEBOOKS; do
    out=.nbtest-gpu/$(basename "${f%.py}").ipynb
    cp "${f%.py}.ipynb" "$out" && .venv/bin/jupytext --quiet --update --to ipynb -o "$out" "$f"
done
step "$(( $(left) > 420 ? 240 : $(left) / 2 ))" env MINIDAPE_QUICK=1 MINIDAPE_EXPECT_EXERCISES=all \
    "$PY" -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env .nbtest-gpu
rm -rf .nbtest-gpu

section "demo at its GPU budget"
demo_out=$(mktemp -d)
if [ "$CPU_ONLY" = 1 ]; then
    step "$(left)" env MINIDAPE_QUICK=1 "$PY" -m minidape demo --out "$demo_out"
else
    step "$(( $(left) > 30 ? $(left) - 10 : 20 ))" "$PY" -m minidape demo --device cuda --out "$demo_out"
fi
[ -f "$demo_out/results.md" ] && cat "$demo_out/results.md" >> "$RESULTS"
rm -rf "$demo_out"

section "done: $FAILED failed step(s) in $((SECONDS - START)) s"
exit "$FAILED"
