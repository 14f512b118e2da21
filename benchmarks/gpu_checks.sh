#!/usr/bin/env bash
# The GPU issue's checks, on a lent GPU machine (the device tool), in two calls: `gpu_checks.sh A` then `B`.
# Each step has its own time limit, so one hang cannot eat the call; everything lands in $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >/dev/null 2>&1 || echo "wheel install failed"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
step() { local t=$1; shift; echo "=== $(date +%T) [$t s] $*"; timeout -k 5 "$t" "$@"; echo "=== rc=$? at $(date +%T)"; }
doctor() {  # doctor NAME BUDGET [script args]
  local name=$1 budget=$2; shift 2
  step $((budget + 70)) python3 -m trainscale doctor --nproc 2 --quick --repeat 2 --cycles 4 --phase-steps 4 \
    --budget "$budget" --timeout 60 --out "/tmp/$name" -- python3 examples/gpt.py --eval-batches 4 --sample 0 "$@"
  tar czf "$OUT/$name.tgz" -C /tmp "$name"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
case "${1:-A}" in
A)
  step 150 python3 -m pytest -q -rP -p no:cacheprovider tests/cuda tests/test_backend.py 2>&1 | tee "$OUT/pytest.log"
  step 70 python3 benchmarks/gpt_mfu.py
  step 45 python3 benchmarks/llama_layer.py
  doctor doctor-gpu-gpt-slow-input 60 --slow-input-ms 0.3
  ;;
B)
  doctor doctor-gpu-gpt-slow-input 60 --slow-input-ms 0.3
  doctor doctor-gpu-gpt-clean 60
  step 90 python3 -m pytest -q -p no:cacheprovider tests/cuda -k two_processes 2>&1 | tail -3
  step 60 python3 -m trainscale train --steps 32 --model resnet18 --model.width 8 --data synthetic \
    --data.image_size 32 --log.progress none --profile --json /tmp/prof/s.json && tar czf "$OUT/prof.tgz" -C /tmp prof
  step 60 python3 benchmarks/fsdp.py --rounds 1
  [ "${2:-}" = step ] && step 100 python3 benchmarks/gpu_step.py --rounds 1 --steps 50 --warmup 10 --amp fp32,bf16
  ;;
C)  # after the fixes: the HTA test, the MFU check on the catalogue's peak
  step 100 python3 -m pytest -q -rP -p no:cacheprovider tests/cuda/test_hta_cuda.py 2>&1 | tail -8
  step 80 python3 benchmarks/gpt_mfu.py
  ;;
D)  # issue 26's accounting overhead on a quiet 16-core host, CUDA and CPU; issue 32's exits on the CUDA paths
  mkdir -p /tmp/d
  for dev in cuda cpu; do
    step 100 python3 benchmarks/doctor_accounting.py --chunks 600 --pairs 2 --device $dev 2>&1 | tee /tmp/d/acct-$dev.txt | tail -4
  done
  for v in full empty full empty full empty; do  # one process; alternated, so drift falls on both variants
    step 25 python3 benchmarks/doctor_accounting_parts.py $v --chunks 200 --device cpu 2>&1 | grep '^{' | tee -a /tmp/d/parts.txt
  done
  for k in 1 2 3 4 5 6; do  # six harnesses at once (each with its own nice'd hog): the 16 cores kept busy
    timeout -s TERM 200 python3 benchmarks/campaigns/exit_stress.py --n 200 --logs /tmp/d/xs$k >/tmp/d/exit$k.json 2>/tmp/d/exit$k.err &
  done
  wait; tail -n1 /tmp/d/exit*.json; tar czf "$OUT/d.tgz" -C /tmp d
  ;;
E)  # after the pipeline's Gloo-on-CUDA refusal: its test, then the exit harness again on every path
  step 150 python3 -m pytest -q -p no:cacheprovider tests/cuda -k "pipeline_over_gloo or two_processes" 2>&1 | tail -5
  mkdir -p /tmp/e
  for k in 1 2 3 4 5 6; do
    timeout -s TERM 130 python3 benchmarks/campaigns/exit_stress.py --n 200 --logs /tmp/e/xs$k >/tmp/e/exit$k.json 2>/tmp/e/exit$k.err &
  done
  wait; tail -qn1 /tmp/e/exit*.json; tar czf "$OUT/e.tgz" -C /tmp e
  ;;
esac
