"""Installs PyTorch from PyPI for the Python package's tests, without what they never use.

PyPI's Linux torch wheel is a CUDA build: its requirements pull ~3 GB of NVIDIA libraries,
which `import torch` loads even on a machine without a GPU (they are DT_NEEDED by libtorch),
and Triton (~1 GB installed), which only `torch.compile` uses. PyTorch's CPU-only wheel index
is not reachable from CI, so this installs the wheel with `--no-deps`, then every requirement
its metadata lists except Triton. Run with the venv's interpreter: `python install_torch.py`.
"""

import importlib.metadata
import subprocess
import sys

SKIP = {"triton"}  # only torch.compile's GPU code generation imports it


def pip(*args: str) -> None:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args])


def main() -> int:
    try:
        importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        pip("--no-deps", "torch")
    reqs = []
    for r in importlib.metadata.requires("torch") or []:
        name = r.split(";")[0].strip()
        marker = r.split(";", 1)[1] if ";" in r else ""
        if "extra ==" in marker:
            continue  # optional extras
        base = name.split("[")[0].split("<")[0].split(">")[0].split("=")[0].split("~")[0].strip()
        if base.lower() in SKIP:
            continue
        reqs.append(r)
    pip(*reqs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
