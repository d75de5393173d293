#!/usr/bin/env bash
# The kernels' GPU checks in one call, for a session lent an NVIDIA machine (an H200 here). Steps:
#   peers   benchmarks/triton_entropy.py --peers: this kernel, Cut Cross-Entropy, Liger and verl (and verl 0.7.0, for
#           parity) against the float64 reference at V 151,936 and 151,935 in two logit regimes, then their forward
#           and forward+backward time and memory at N 8192 and 32768. The peers travel as wheels: run
#           `bash benchmarks/fetch_peer_wheels.sh` here and name .whl in the call's carry; they are installed into
#           /tmp/site first;
#   triton  parity against the float64 reference, a launch-config sweep at the first N, then triton vs naive vs the
#           bare-matmul floor at N 8192 and 32768 (D 4096, V 151,936, bf16): time and peak memory;
#   jax     benchmarks/entropy_kernels.py at the same shapes: naive, xla (the backend's default tiles), floor;
#   tiles   xla alone with other tile sizes (XLA's GPU loops pay per trip, so the tile size matters there).
# Each step has its own time limit, so one that hangs or runs long leaves the others their time; peers runs first.
# Results and logs go to $OUT (the device tool's folder) or benchmarks/out/; at most 8 files come back from $OUT, so
# name a few steps per call (peers and triton write 6 with gpu.txt).
#     bash benchmarks/gpu_session.sh                 # all steps; or name some: bash benchmarks/gpu_session.sh peers
set -u
out=${OUT:-benchmarks/out}
mkdir -p "$out"
py=${PYTHON:-python3}
steps=${*:-peers triton jax tiles}
site=
if [[ " $steps " == *" peers "* ]] && compgen -G ".whl/*.whl" >/dev/null; then
  # the device README's recipe: no registry there and no dependencies (torch and triton are on the image)
  if $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  then site=/tmp/site
  else echo "the peers' wheels did not install: they will show as not installed"
  fi
fi
export PYTHONPATH="$PWD${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
shapes=(--dtype bfloat16 --n 8192 32768 --v 151936 --d 4096 --repeats 3)

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
$py -c "import jax, torch, triton; print('jax', jax.__version__, 'torch', torch.__version__, 'triton',
triton.__version__, torch.cuda.get_device_name())" 2>&1 | tee -a "$out/gpu.txt"
if [[ " $steps " == *" peers "* ]]; then
  # jax, imported by the kernels package, must not grab 75% of the memory the torch kernels need
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "${T_PEERS:-420}" $py benchmarks/triton_entropy.py --peers \
    --budget-s 1 --out "$out/triton_entropy_peers.json" 2>&1 | tee "$out/peers.log"
fi
if [[ " $steps " == *" triton "* ]]; then
  # torch owns the GPU here; the kernels package imports jax, which must not grab 75% of the memory first
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "${T_TRITON:-240}" $py benchmarks/triton_entropy.py --sweep \
    --budget-s 0.5 --out "$out/triton_entropy.json" 2>&1 | tee "$out/triton.log"
fi
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.9  # naive at N = 32768 needs tens of GiB
if [[ " $steps " == *" jax "* ]]; then
  timeout "${T_JAX:-200}" $py benchmarks/entropy_kernels.py "${shapes[@]}" \
    --out "$out/entropy_kernels_h200.json" 2>&1 | tee "$out/jax.log"
fi
if [[ " $steps " == *" tiles "* ]]; then
  for tiles in "2048 8192" "4096 8192" "8192 4096"; do
    set -- $tiles
    timeout "${T_TILES:-60}" $py benchmarks/entropy_kernels.py "${shapes[@]}" --impls xla --block-n "$1" \
      --block-v "$2" --out "$out/xla_tiles_$1x$2.json" 2>&1 | tee -a "$out/tiles.log"
  done
fi
