#!/usr/bin/env bash
# Wheels of the kernels that `benchmarks/gpu/triton_entropy.py --peers` runs beside this project's, and of the JAX libraries
# this project pins (flax, optax: the image has its own versions), for the device machine (Python 3.12, x86-64, no
# registry; torch, triton and jax are on its image). All are pure Python (+ Triton), fetched without their
# dependencies: verl's (ray, transformers, tensordict, ...) are never imported, benchmarks/gpu/peers.py loads only verl's
# kernel files. Into the git-ignored .whl/, which benchmarks/gpu/gpu_session.sh installs (one version of each package:
# two would stop that install, so older versions of these are removed); verl 0.7.0, the release
# before its vocabulary-padding fix, goes to .whl/parity-only/, which is read as a zip, never installed.
#     bash benchmarks/gpu/fetch_peer_wheels.sh      # then name .whl in the device call's carry
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-python3}
pins=(cut-cross-entropy==25.1.1 liger-kernel==0.8.5 verl==0.9.1 flax==0.12.8 optax==0.2.8)
old=verl==0.7.0

get() {  # the device README's recipe: the wheel pip would pick for CPython 3.12 on manylinux x86-64
  local dest=$1
  shift
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dest" "$@"
}

mkdir -p .whl/parity-only
for pin in "${pins[@]}"; do
  name=${pin%%==*}
  stem=${name//-/_}-${pin##*==}-
  for f in .whl/"${name//-/_}"-*.whl; do
    if [[ -e $f && $f != .whl/$stem* ]]; then rm -v "$f"; fi
  done
  get .whl "$pin"
done
get .whl/parity-only "$old"
ls -l .whl/*.whl .whl/parity-only/*.whl
du -sh .whl
