"""cvc's diagnostics and bad inputs become Python exceptions, never a crash."""

import numpy as np
import pytest

import cvc
from conftest import complex_normal, parity_batch

BAD_SRC = """\
model Bad {
    input x: c64[B, 4]
    input label: class[B] of 2
    logits = x |> linaer(2) |> abs
    output logits
    loss cross_entropy(logits, label)
}
"""


def test_a_diagnostic_is_a_compile_error_with_its_location():
    with pytest.raises(cvc.CompileError) as info:
        cvc.Model.from_source(BAD_SRC, "bad.cvnn")
    e = info.value
    assert isinstance(e, cvc.Error) and isinstance(e, RuntimeError)
    assert e.file == "bad.cvnn"
    assert e.line == 4
    assert e.column == BAD_SRC.splitlines()[3].index("linaer") + 1
    text = str(e)
    assert "linaer" in text and "bad.cvnn:4" in text


def test_a_missing_file_is_an_error(tmp_path):
    # The message names the file and what is wrong with it (runtime/src/files.rs).
    with pytest.raises(cvc.Error, match=r"nope\.cvnn: no such file"):
        cvc.Model.from_file(tmp_path / "nope.cvnn")


def test_wrong_shape_names_the_input_and_the_expected_shape(parity_model, rng):
    s = parity_model.session(device="cpu")
    b = parity_batch(rng)
    b["x"] = complex_normal(rng, (8, 2, 15))
    with pytest.raises(cvc.DataError) as info:
        s.train_step(b)
    msg = str(info.value)
    assert "'x'" in msg and "[8, 2, 16]" in msg and "[8, 2, 15]" in msg


def test_a_real_array_for_a_complex_input_is_a_data_error(parity_model, rng):
    s = parity_model.session(device="cpu")
    b = parity_batch(rng)
    b["x"] = b["x"].real.copy()
    with pytest.raises(cvc.DataError, match="complex64"):
        s.train_step(b)


def test_missing_and_unknown_inputs(parity_model, rng):
    s = parity_model.session(device="cpu")
    b = parity_batch(rng)
    with pytest.raises(cvc.DataError, match="no 'label'"):
        s.train_step({"x": b["x"]})
    with pytest.raises(cvc.DataError, match="'y', which is not an input"):
        s.train_step({**b, "y": b["x"]})
    with pytest.raises(cvc.DataError, match="empty"):
        s.infer({})


def test_labels_out_of_range(parity_model, rng):
    s = parity_model.session(device="cpu")
    b = parity_batch(rng)
    b["label"][3] = 3
    with pytest.raises(cvc.DataError, match=r"0\.\.3.*found 3"):
        s.train_step(b)
    b["label"] = b["label"].astype(np.int64)
    b["label"][3] = 1 << 40
    with pytest.raises(cvc.DataError, match="int32"):
        s.train_step(b)


def test_a_bad_state_dict(parity_model):
    s = parity_model.session(device="cpu")
    sd = s.state_dict()
    with pytest.raises(cvc.DataError, match="not a tensor of this model"):
        s.load_state_dict({**sd, "extra.weight": np.zeros(3, np.float32)})
    s.load_state_dict({**sd, "extra.weight": np.zeros(3, np.float32)}, strict=False)
    w = "logits.linear_0.weight"
    with pytest.raises(cvc.DataError, match=r"'logits.linear_0.weight': expected shape \[3, 64\]"):
        s.load_state_dict({**sd, w: sd[w].T})
    partial = dict(sd)
    del partial[w]
    with pytest.raises(cvc.DataError, match="missing parameter"):
        s.load_state_dict(partial)


def test_a_bad_checkpoint(parity_model, tmp_path):
    s = parity_model.session(device="cpu")
    with pytest.raises(cvc.DataError, match="no such checkpoint"):
        s.load(tmp_path / "none.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    with pytest.raises(cvc.DataError, match="safetensors"):
        s.load(junk)
