"""save/load: safetensors files that round-trip parameters, state and metadata."""

import numpy as np

from conftest import parity_batch


def test_save_and_load_round_trip(parity_model, rng, tmp_path):
    s = parity_model.session(device="cpu")
    b = parity_batch(rng)
    for _ in range(3):
        s.train_step(b)
    path = tmp_path / "ck.safetensors"
    s.save(path, {"epoch": "3"})
    other = parity_model.session(device="cpu", seed=99)
    meta = other.load(path)
    assert meta["epoch"] == "3" and meta["model"] == "Parity"
    full, got = s.state_dict(optimizer=True), other.state_dict(optimizer=True)
    assert full.keys() == got.keys()
    for k in full:
        np.testing.assert_array_equal(got[k], full[k], err_msg=k)
    # The next steps agree too (optimizer state and counters came along).
    np.testing.assert_array_equal(s.train_step(b).outputs["logits"], other.train_step(b).outputs["logits"])


def test_checkpoint_is_readable_by_safetensors_layout(parity_model, tmp_path):
    # Complex tensors are stored as float32 [..., 2] (torch.view_as_real), per checkpoint.rs.
    import json
    import struct

    s = parity_model.session(device="cpu")
    path = tmp_path / "w.safetensors"
    s.save(path)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    w = header["logits.linear_0.weight"]
    # PyTorch's layout on disk ([out, in], as nn.Linear) with the complex pair last.
    assert w["dtype"] == "F32" and w["shape"] == [3, 64, 2]
    assert "logits.linear_0.weight" in header["__metadata__"]["cvc.complex"].split(",")
