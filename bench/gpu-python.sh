#!/usr/bin/env bash
# The Python package on an NVIDIA GPU: installs a prebuilt cvc wheel (and pytest's wheels) from
# $CVC_GPU_BIN/wheels into a venv that sees the machine's PyTorch, then runs the CUDA tests
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
VENV=${TMPDIR:-/tmp}/cvc-gpu-venv
python3 -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install -q --no-index --find-links "$BIN/wheels" --no-deps "$BIN"/wheels/*.whl
"$VENV/bin/python" -c "import sys, torch, numpy, cvc; print('python', sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__, 'cuda', torch.cuda.is_available(), 'cvc cuda', cvc.cuda_available())"
status=0
"$VENV/bin/python" -m pytest python/tests -q -rs 2>&1 | tee "$LOG/python-tests.log" | tail -25
[ "${PIPESTATUS[0]}" = 0 ] || { echo "PYTHON TESTS FAILED"; status=1; }
"$VENV/bin/python" python/examples/torch_parity.py --device cuda 2>&1 | tee "$LOG/torch-parity-cuda.log" | tail -15
[ "${PIPESTATUS[0]}" = 0 ] || { echo "TORCH PARITY ON CUDA FAILED"; status=1; }
exit $status
