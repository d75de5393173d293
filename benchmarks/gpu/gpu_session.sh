#!/usr/bin/env bash
# The GPU measurements in one call, for a session lent an NVIDIA machine (an H200 here). Steps:
#   peers   benchmarks/gpu/triton_entropy.py --peers: this project's Triton kernel (with and without the entropy), its JAX
#           kernel (xla), Cut Cross-Entropy, Liger and verl (and verl 0.7.0, for parity) against the float64
#           reference at V 151,936 and 151,935 in two logit regimes, then forward and forward+backward time and memory
#           beside the bare matmuls at N 8192, D 4096, both V, bf16;
#   rl      benchmarks/training/step_gpu.py rl: the RL update of a Qwen3-VL-4B-shaped random policy, whole rows and shared
#           prefix: tokens/s and MFU;
#   decode  benchmarks/training/step_gpu.py decode: the paged engine's decode step at 1, 16 and 64 sequences against the HBM
#           roofline;
#   all     benchmarks/training/step_gpu.py all (issue 47, one call of ~7 min, an H200: the 4B full update needs ~97 GiB):
#           decode at 1, 16, 64 sequences with and without the Pallas paged kernel and command buffers, the update
#           with remat full vs dots and the shared prefix on the Pallas flash kernel, then whole RL steps (rollouts +
#           update) before and after; `bash benchmarks/gpu/gpu_session.sh all`;
#   triton  benchmarks/gpu/triton_entropy.py --sweep: parity, launch-config sweep, triton vs naive vs floor;
#   jax     benchmarks/kernels/entropy_kernels.py at N 8192 and 32768: naive, xla, floor;
#   tiles   xla alone with other tile sizes.
# The peers and the JAX libraries this project pins travel as wheels: run `bash benchmarks/gpu/fetch_peer_wheels.sh`
# here and name .whl in the call's carry; they are installed into /tmp/site first (torch, triton and jax are the
# image's). Each step has its own time limit (T_PEERS, ...), so one that hangs or fails leaves the others their
# time. Results go to $OUT (the device tool's folder) or benchmarks/out/: one log for all steps and a JSON (and for
# peers a markdown table) per step, within the 8 files a call brings back.
#     bash benchmarks/gpu/gpu_session.sh                 # peers rl decode; or name steps: bash benchmarks/gpu/gpu_session.sh rl
# RL_ARGS, DECODE_ARGS and ALL_ARGS add arguments to those steps (a CPU dry run: RL_ARGS="--model tiny --image 64 ...").
set -u
out=${OUT:-benchmarks/out}
mkdir -p "$out"
log=$out/session.log
py=${PYTHON:-python3}
steps=${*:-peers rl decode}
site=
if compgen -G ".whl/*.whl" >/dev/null; then
  # the device README's recipe: no registry there and no dependencies (they are on the image)
  if $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  then site=/tmp/site
  else echo "the carried wheels did not install: the image's versions (or none) are used" | tee -a "$log"
  fi
fi
if [[ -n $site ]] && ! PYTHONPATH=$site $py -c "import flax.nnx, optax" >/dev/null 2>&1; then
  # the pinned flax or optax does not import beside the image's jax: the image's own versions are used
  echo "the carried flax/optax do not import here: using the image's" | tee -a "$log"
  rm -rf "$site"/flax* "$site"/optax*
fi
export PYTHONPATH="$PWD${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
has() { [[ " $steps " == *" $1 "* ]]; }
run() {  # run NAME SECONDS CMD...: the step's output into the log, its exit status and wall time after it
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  echo "=== $name (limit ${limit} s)" | tee -a "$log"
  timeout "$limit" "$@" 2>&1 | tee -a "$log"
  echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s" | tee -a "$log"
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
$py -c "import jax, flax, optax, torch, triton; print('jax', jax.__version__, jax.devices(), 'flax', flax.__version__,
'optax', optax.__version__, 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" \
  2>&1 | tee -a "$out/gpu.txt"
# torch and JAX share the GPU in the peers step: JAX must not take 75% of its memory first
if has peers; then
  XLA_PYTHON_CLIENT_PREALLOCATE=false run peers "${T_PEERS:-170}" $py benchmarks/gpu/triton_entropy.py --peers --ns 8192 \
    --parity-n 2048 --budget-s 0.5 --out "$out/triton_entropy_peers.json"
fi
# JAX alone on the GPU: a 4B model's weights, Adam state and activations need most of its memory
if has rl; then
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.92 run rl "${T_RL:-240}" $py benchmarks/training/step_gpu.py rl ${RL_ARGS:-} \
    --out "$out/step_gpu_rl.json"
fi
if has decode; then
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.92 run decode "${T_DECODE:-240}" $py benchmarks/training/step_gpu.py decode \
    ${DECODE_ARGS:-} --out "$out/step_gpu_decode.json"
fi
if has all; then
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.92 run all "${T_ALL:-560}" $py benchmarks/training/step_gpu.py all ${ALL_ARGS:-} \
    --out "$out/step_gpu_all.json"
fi
if has triton; then
  XLA_PYTHON_CLIENT_PREALLOCATE=false run triton "${T_TRITON:-240}" $py benchmarks/gpu/triton_entropy.py --sweep \
    --budget-s 0.5 --out "$out/triton_entropy.json"
fi
shapes=(--dtype bfloat16 --n 8192 32768 --v 151936 --d 4096 --repeats 3)
if has jax; then
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 run jax "${T_JAX:-200}" $py benchmarks/kernels/entropy_kernels.py "${shapes[@]}" \
    --out "$out/entropy_kernels_h200.json"
fi
if has tiles; then
  for tiles in "2048 8192" "4096 8192" "8192 4096"; do
    set -- $tiles
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 run "tiles $1x$2" "${T_TILES:-60}" $py benchmarks/kernels/entropy_kernels.py \
      "${shapes[@]}" --impls xla --block-n "$1" --block-v "$2" --out "$out/xla_tiles_$1x$2.json"
  done
fi
