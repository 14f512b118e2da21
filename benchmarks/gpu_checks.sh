#!/usr/bin/env bash
# The GPU issue's checks, on a lent GPU machine (the device tool): `gpu_checks.sh F` is this wave's, in one call
# (A to E were earlier waves'). Each step has its own time limit, so one hang cannot eat the call; F's limits are
# also cut to what is left of its 560 s; everything lands in $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >/dev/null 2>&1 || echo "wheel install failed"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}; mkdir -p /tmp/doc
T0=$SECONDS
left() { local t=$(( 560 - (SECONDS - T0) )); [ "$1" -lt "$t" ] && t=$1; [ "$t" -lt 5 ] && t=5; echo "$t"; }
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
F)  # this wave: the step against plain/accelerate/Fabric, the doctor on unmodified scripts, the CUDA tests, MFU
  step "$(left 100)" python3 benchmarks/step_gpu.py --rounds 3 --steps 20 2>&1 | tee "$OUT/step_eager.log"
  step "$(left 200)" python3 benchmarks/step_gpu.py --rounds 3 --steps 20 --compile 2>&1 | tee "$OUT/step_compile.log"
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
  unmodified() {  # NAME SCRIPT [script args]: the doctor on a suite script as a user launches it, 2 ranks on the GPU
    local name=$1 script=$2; shift 2
    step "$(left 110)" python3 -m trainscale doctor --nproc 2 --quick --repeat 2 --cycles 4 --phase-steps 6 \
      --budget 40 --timeout 60 --out "/tmp/doc/$name" -- torchrun --nproc-per-node 2 \
      "tests/inject/scripts/$script" --steps 100000 "$@" >"/tmp/doc/$name.log" 2>&1
    echo "$name: rc $?"; tail -n 25 "/tmp/doc/$name.log"
  }
  mkdir -p /tmp/doc  # the two scripts' doctors side by side (4 ranks on the GPU, 16 cores), each clean then slow
  { unmodified ddp-clean ddp_train.py --device cuda; unmodified ddp-slow ddp_train.py --device cuda \
      --slow-collate-ms 20; } >/tmp/doc/ddp.out 2>&1 &
  { unmodified hf-clean hf_train.py --cuda; unmodified hf-slow hf_train.py --cuda --slow-collate-ms 20; } \
      >/tmp/doc/hf.out 2>&1 &
  wait; cat /tmp/doc/ddp.out /tmp/doc/hf.out; tar czf "$OUT/doctors.tgz" -C /tmp doc
  step "$(left 80)" python3 benchmarks/gpt_mfu.py 2>&1 | tee "$OUT/mfu.log" | tail -n 6
  step "$(left 150)" python3 -m pytest -q -rs -n 3 -p no:cacheprovider tests/cuda tests/test_backend.py \
    tests/train/test_amp_loss.py tests/data/test_data_pack_errors.py::test_cuda_prefetch_copies_on_a_side_stream \
    2>&1 | tee "$OUT/pytest.log" | tail -n 30
  ;;
G)  # after F's fixes: the fp16 overflow test, HTA (wheels carried), the doctor's words on F's two findings
  step "$(left 150)" python3 -m pytest -q -rs -n 3 -p no:cacheprovider tests/train/test_amp_loss.py \
    tests/cuda/test_hta_cuda.py tests/inject/test_setup_syncs.py 2>&1 | tee "$OUT/pytest.log" | tail -n 12
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
  for job in "hf-clean hf_train.py --cuda" "ddp-clean ddp_train.py --device cuda"; do
    set -- $job; name=$1 script=$2; shift 2
    step "$(left 110)" python3 -m trainscale doctor --nproc 2 --quick --repeat 2 --cycles 4 --phase-steps 6 \
      --budget 40 --timeout 60 --out "/tmp/doc/$name" -- torchrun --nproc-per-node 2 \
      "tests/inject/scripts/$script" --steps 100000 "$@" >"/tmp/doc/$name.log" 2>&1
    echo "$name: rc $?"; grep -A3 "failed\|host_syncs" "/tmp/doc/$name.log" | head -n 12
  done
  tar czf "$OUT/doctors.tgz" -C /tmp doc
  ;;
esac
