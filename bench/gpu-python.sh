#!/usr/bin/env bash
# The Python package on an NVIDIA GPU: installs a prebuilt cvc wheel (and pytest's wheels) from
# $CVC_GPU_BIN/wheels into a folder on PYTHONPATH (the machine's python3 keeps its own PyTorch
# and NumPy, which a venv would not see when they live in the user site), then runs the CUDA tests
# (DLPack device-to-device inputs) and the PyTorch parity example on the GPU.
#
# Builds nothing. Make the wheel on the build machine with:
#   maturin build --release --strip -m python/Cargo.toml -o .gpu/wheels
#   pip download pytest -d .gpu/wheels
set -u
cd "$(dirname "$0")/.."
BIN=${CVC_GPU_BIN:-.gpu}
LOG=${OUT:-bench/out}
mkdir -p "$LOG"
SITE=${TMPDIR:-/tmp}/cvc-gpu-site
rm -rf "$SITE"
python3 -m pip install -q --no-index --no-deps --target "$SITE" "$BIN"/wheels/*.whl 2>/dev/null ||
  python3 -m pip install -q --no-index --no-deps --break-system-packages --target "$SITE" "$BIN"/wheels/*.whl
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
PYBIN=python3
"$PYBIN" -c "import sys, torch, numpy, cvc; print('python', sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__, 'cuda', torch.cuda.is_available(), 'cvc cuda', cvc.cuda_available())"
status=0
"$PYBIN" -m pytest python/tests -q -rs 2>&1 | tee "$LOG/python-tests.log" | tail -25
[ "${PIPESTATUS[0]}" = 0 ] || { echo "PYTHON TESTS FAILED"; status=1; }
"$PYBIN" python/examples/torch_parity.py --device cuda 2>&1 | tee "$LOG/torch-parity-cuda.log" | tail -15
[ "${PIPESTATUS[0]}" = 0 ] || { echo "TORCH PARITY ON CUDA FAILED"; status=1; }
exit $status
