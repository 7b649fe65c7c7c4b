"""Shared fixtures of the cvc package's tests: models, seeds and random batches.

Seeds follow docs/TESTING.md: each test's seed is a fixed function of its name and of the
base seed ``CVC_SEED`` (the same FNV-1a + SplitMix64 mix as tests/src/seed.rs), printed so a
failure can be replayed.
"""

import os

import numpy as np
import pytest

DEFAULT_BASE = 0x5EED_C0DE
MASK = (1 << 64) - 1

# A tiny classifier: complex input, conv1d, modrelu, linear, magnitudes as logits.
PARITY_SRC = """\
model Parity {
    input x:     c64[B, 2, 16]
    input label: class[B] of 3

    logits = x |> conv1d(4, kernel = 3, pad = 1) |> modrelu |> flatten |> linear(3) |> abs
    output logits
    loss cross_entropy(logits, label)
}

train Parity {
    batch     = 8
    optimizer = sgd(lr = 0.05)
    seed      = 3
}
"""

# The smallest trainable model: one complex linear layer.
TINY_SRC = """\
model Tiny {
    input x:     c64[B, 4]
    input label: class[B] of 2

    logits = x |> linear(2) |> abs
    output logits
    loss cross_entropy(logits, label)
}

train Tiny {
    batch     = 8
    optimizer = adam(lr = 0.05)
}
"""


def base_seed() -> int:
    s = os.environ.get("CVC_SEED")
    if s is None:
        return DEFAULT_BASE
    s = s.strip()
    return int(s, 16) if s.lower().startswith("0x") else int(s)


def seed_for(name: str) -> int:
    """tests/src/seed.rs's seed_for: the base mixed with an FNV-1a hash of the name."""
    base = base_seed()
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & MASK
    z = base ^ h
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    seed = z ^ (z >> 31)
    print(f"{name}: seed {seed:#x} from base {base:#x} (replay: CVC_SEED={base:#x})")
    return seed


@pytest.fixture
def rng(request) -> np.random.Generator:
    return np.random.default_rng(seed_for(request.node.name))


def complex_normal(rng: np.random.Generator, shape) -> np.ndarray:
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)


def parity_batch(rng: np.random.Generator, n: int = 8) -> dict:
    return {"x": complex_normal(rng, (n, 2, 16)), "label": rng.integers(0, 3, n).astype(np.int32)}


def tiny_batch(rng: np.random.Generator, n: int = 8) -> dict:
    return {"x": complex_normal(rng, (n, 4)), "label": rng.integers(0, 2, n).astype(np.int32)}


@pytest.fixture
def parity_model():
    import cvc

    return cvc.Model.from_source(PARITY_SRC, "parity.cvnn")


@pytest.fixture
def tiny_model():
    import cvc

    return cvc.Model.from_source(TINY_SRC, "tiny.cvnn")


def torch_or_skip():
    return pytest.importorskip("torch")
