"""CUDA tensors reach a CUDA session through DLPack, device to device. Skips without a GPU
(the lead runs it on the H200: `pytest python/tests/test_cuda.py`)."""

import numpy as np
import pytest

import cvc
from conftest import parity_batch

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and cvc.cuda_available()), reason="needs a CUDA GPU usable by torch and cvc"
)


def test_cuda_tensors_are_read_in_place_on_the_device(parity_model, rng):
    b = parity_batch(rng)
    host = parity_model.session(device="cuda")
    dev = parity_model.session(device="cuda")
    x = torch.from_numpy(b["x"]).cuda()
    label = torch.from_numpy(b["label"]).cuda()
    before = cvc.staging_copies()
    r_dev = dev.train_step({"x": x, "label": label})
    assert cvc.staging_copies() == before
    got = dev._last_input_addresses()
    assert got["x"] == ("cuda", x.data_ptr())
    assert got["label"] == ("cuda", label.data_ptr())
    r_host = host.train_step(b)
    assert r_dev.loss == r_host.loss
    np.testing.assert_array_equal(r_dev.outputs["logits"], r_host.outputs["logits"])


def test_int64_cuda_labels_are_converted_on_the_device(parity_model, rng):
    b = parity_batch(rng)
    s = parity_model.session(device="cuda")
    before = cvc.staging_copies()
    s.train_step({"x": torch.from_numpy(b["x"]).cuda(), "label": torch.from_numpy(b["label"]).long().cuda()})
    assert cvc.staging_copies() == before + 1
    assert s._last_input_addresses()["label"][0] == "cuda"


def test_cuda_tensor_for_a_cpu_session_is_copied_to_the_host(parity_model, rng):
    b = parity_batch(rng)
    s = parity_model.session(device="cpu")
    ref = parity_model.session(device="cpu").infer(b)["logits"]
    before = cvc.staging_copies()
    out = s.infer({"x": torch.from_numpy(b["x"]).cuda()})["logits"]
    assert cvc.staging_copies() == before + 1
    np.testing.assert_array_equal(out, ref)


def test_cuda_outputs_as_torch(parity_model, rng):
    s = parity_model.session(device="cuda")
    out = s.infer(parity_batch(rng), as_torch=True)["logits"]
    assert isinstance(out, torch.Tensor) and out.shape == (8, 3)
