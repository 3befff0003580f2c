#!/bin/bash
# The checks that need a 16-core machine with a GPU, as one command (docs/runners.md):
#   * scaling.py: the reference pipeline on W = 1, 4, 8, 16 workers (threads, process, lane
#     workers) against the raw tokenizer on every core, in the same run;
#   * gpu_feed.py: step time of a bf16 Llama fed live over the step time on a kept batch, at 5M
#     and 90M parameters (ceiling, in process, engine_process, PipelineDataLoader, lane_workers).
# Each writes its table and JSON line to $OUT (or /tmp/device-checks).
#
# A device machine has no package index: wheels its image lacks travel in .whl (git ignores it),
# downloaded on the development machine first, for its Python (3.12, x86-64):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl msgspec zstandard
# then run `bash benchmarks/device_checks.sh` there with .whl carried along.
#
# DOCS, WORKERS, ROUNDS, SIZES, STEPS, FEED_WORKERS and FEED_ARGS (more gpu_feed.py options)
# override the sizes; a quick try on a CPU machine: DOCS=480 WORKERS=1 ROUNDS=1 SIZES=tiny
# STEPS=1 FEED_WORKERS=1 FEED_ARGS="--warmup 1 --seq-len 128 --batch-size 2"
# bash benchmarks/device_checks.sh
set -euo pipefail
out=${OUT:-/tmp/device-checks}
mkdir -p "$out"
python=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/device-site .whl/*.whl
    export PYTHONPATH=/tmp/device-site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
data=$(mktemp -d)
{
    echo "cores: $("$python" -c 'import os; print(os.cpu_count())')"
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "gpu: none"
} | tee "$out/machine.txt"
"$python" benchmarks/scaling.py --docs "${DOCS:-60000}" --workers "${WORKERS:-1,4,8,16}" \
    --rounds "${ROUNDS:-1}" --data "$data/scaling" 2>&1 | tee "$out/scaling.txt"
for size in ${SIZES:-5m 90m}; do
    # shellcheck disable=SC2086 # FEED_ARGS holds several options
    "$python" benchmarks/gpu_feed.py --model-size "$size" --steps "${STEPS:-20}" \
        --workers "${FEED_WORKERS:-12}" --data "$data/gpu_feed" ${FEED_ARGS:-} 2>&1 |
        tee "$out/gpu_feed_$size.txt"
done
