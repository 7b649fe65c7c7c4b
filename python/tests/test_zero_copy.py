"""Inputs are read in place where the layout allows, and converted (once, counted) otherwise."""

import numpy as np
import pytest

import cvc
from conftest import parity_batch, torch_or_skip


def addresses(s):
    return s._last_input_addresses()


def test_contiguous_arrays_of_the_right_dtype_are_not_copied(parity_model, rng):
    s = parity_model.session(device="cpu")
    b = parity_batch(rng)
    before = cvc.staging_copies()
    s.train_step(b)
    assert cvc.staging_copies() == before
    got = addresses(s)
    assert got["x"] == ("host", b["x"].ctypes.data)
    assert got["label"] == ("host", b["label"].ctypes.data)
    s.infer({"x": b["x"]})
    assert addresses(s) == {"x": ("host", b["x"].ctypes.data)}
    assert cvc.staging_copies() == before


def test_other_layouts_are_converted_once_with_the_same_result(parity_model, rng):
    b = parity_batch(rng)
    ref = parity_model.session(device="cpu").infer(b)["logits"]
    wide = np.zeros((8, 2, 32), np.complex64)
    wide[:, :, ::2] = b["x"]
    s = parity_model.session(device="cpu")
    cases = {
        "complex128": {"x": b["x"].astype(np.complex128), "label": b["label"]},
        "strided": {"x": wide[:, :, ::2], "label": b["label"]},
        "fortran": {"x": np.asfortranarray(b["x"]), "label": b["label"]},
        "int64 labels": {"x": b["x"], "label": b["label"].astype(np.int64)},
    }
    for name, batch in cases.items():
        before = cvc.staging_copies()
        out = s.infer(batch)["logits"]
        assert cvc.staging_copies() == before + 1, name
        np.testing.assert_array_equal(out, ref, err_msg=name)
        src = next(v for v in batch.values() if not (v.flags.c_contiguous and v.dtype in (np.complex64, np.int32)))
        key = next(k for k, v in batch.items() if v is src)
        assert addresses(s)[key][1] != src.ctypes.data, name


def test_torch_cpu_tensors_are_read_in_place(parity_model, rng):
    torch = torch_or_skip()
    s = parity_model.session(device="cpu")
    b = parity_batch(rng)
    tb = {"x": torch.from_numpy(b["x"]), "label": torch.from_numpy(b["label"])}
    before = cvc.staging_copies()
    r = s.train_step(tb)
    assert cvc.staging_copies() == before
    assert addresses(s)["x"] == ("host", tb["x"].data_ptr())
    assert addresses(s)["label"] == ("host", tb["label"].data_ptr())
    # A tensor that requires grad is read too (its data, without autograd).
    x = tb["x"].clone().requires_grad_(True)
    out = s.infer({"x": x}, as_torch=True)["logits"]
    assert isinstance(out, torch.Tensor) and out.shape == (8, 3)
    assert np.isfinite(r.loss)


def test_outputs_are_fresh_arrays(parity_model, rng):
    s = parity_model.session(device="cpu")
    b = parity_batch(rng)
    a = s.infer(b)["logits"]
    keep = a.copy()
    s.train_step(b)
    s.infer(b)
    # The next step reuses the arena; an output handed out before must not change.
    np.testing.assert_array_equal(a, keep)
    assert a.flags.owndata or a.base is not None
    assert a.flags.writeable


@pytest.mark.parametrize("device", ["cpu", "interp"])
def test_results_do_not_depend_on_the_input_path(parity_model, rng, device):
    b = parity_batch(rng)
    s1 = parity_model.session(device=device)
    s2 = parity_model.session(device=device)
    l1 = s1.train_step(b).loss
    l2 = s2.train_step({k: v.tolist() for k, v in b.items()}).loss  # lists: converted
    assert l1 == l2
