"""State dicts interchange with PyTorch: names, layouts and dtypes; the same network in
PyTorch and in cvc computes the same loss and gradients."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import cvc
from conftest import parity_batch

torch = pytest.importorskip("torch")
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


parity = load_example("torch_parity")


def test_names_shapes_and_dtypes_match_the_torch_module():
    net = parity.Parity()
    s = cvc.Model.from_source(parity.SOURCE).session(device="cpu")
    ours = s.state_dict()
    theirs = net.state_dict()
    assert sorted(ours) == sorted(theirs)
    for k, t in theirs.items():
        assert ours[k].shape == tuple(t.shape), k
        assert str(ours[k].dtype) == str(t.dtype).replace("torch.", ""), k
    # torch.nn.Linear's [out, in], which is also cvc's layout.
    assert ours["logits.linear_0.weight"].shape == (3, 64)


def test_round_trip_through_torch(rng):
    s = cvc.Model.from_source(parity.SOURCE).session(device="cpu", seed=11)
    sd = s.state_dict(as_torch=True)
    assert all(isinstance(v, torch.Tensor) for v in sd.values())
    net = parity.Parity()
    net.load_state_dict(sd)  # strict: same keys, shapes, dtypes
    fresh = cvc.Model.from_source(parity.SOURCE).session(device="cpu", seed=12)
    fresh.load_state_dict(net.state_dict())
    for k, v in s.state_dict().items():
        np.testing.assert_array_equal(fresh.state_dict()[k], v, err_msg=k)
    # And the torch module computes what the session computes.
    b = parity_batch(rng)
    with torch.no_grad():
        t = net(torch.from_numpy(b["x"])).numpy()
    np.testing.assert_allclose(s.infer(b)["logits"], t, rtol=1e-5, atol=1e-5)


def test_batchnorm_buffers_use_torch_names(rng):
    src = """\
model Real {
    input x: f32[B, 3, 8]
    input label: class[B] of 2
    logits = x |> batchnorm |> flatten |> linear(2, real = true)
    output logits
    loss cross_entropy(logits, label)
}
"""
    s = cvc.Model.from_source(src).session(device="cpu")
    sd = s.state_dict()
    bn = torch.nn.BatchNorm1d(3)
    keys = {k.split(".", 2)[2] for k in sd if ".batchnorm_0." in k}
    assert keys == {"weight", "bias", "running_mean", "running_var"}
    # A torch BatchNorm1d's state dict (with num_batches_tracked) loads into the session.
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.running_mean.uniform_(-1, 1)
    mine = {k: v for k, v in sd.items() if ".batchnorm_0." not in k}
    mine.update({f"logits.batchnorm_0.{k}": v for k, v in bn.state_dict().items()})
    s.load_state_dict(mine)
    np.testing.assert_array_equal(s.state_dict()["logits.batchnorm_0.weight"], bn.weight.detach().numpy())
    # Inference with running statistics is torch's eval mode.
    lin = torch.nn.Linear(24, 2)
    lin.weight.data = torch.from_numpy(sd["logits.linear_0.weight"])
    lin.bias.data = torch.from_numpy(sd["logits.linear_0.bias"])
    x = rng.standard_normal((4, 3, 8)).astype(np.float32)
    bn.eval()
    with torch.no_grad():
        want = lin(bn(torch.from_numpy(x)).flatten(1)).numpy()
    np.testing.assert_allclose(s.infer({"x": x})["logits"], want, rtol=1e-4, atol=1e-5)


def test_parity_example_at_small_size(capsys):
    assert parity.main(["--batch", "4", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "gradients" in out and "FAIL" not in out


def test_parity_catches_a_wrong_gradient(monkeypatch):
    # The comparison is not vacuous: a perturbed PyTorch gradient fails it.
    real = parity.torch_step

    def wrong(net, batch):
        loss, logits, grads = real(net, batch)
        grads["logits.conv1d_0.bias"] = grads["logits.conv1d_0.bias"] * 1.01
        return loss, logits, grads

    monkeypatch.setattr(parity, "torch_step", wrong)
    assert parity.main(["--batch", "4", "--steps", "1"]) == 1


def test_nn_linear_weights_load_unchanged_square_and_on_a_sequence(rng):
    # A square weight would load silently transposed if the layouts differed; applied to
    # every token of [B, T, in] as nn.Linear does.
    src = """\
model Seq {
    input x: c64[B, 3, 4]
    input t: c64[B, 3, 2]
    y = x |> linear(4)
    z = y |> linear(2)
    output z
    loss mse(z, t)
}
"""
    s = cvc.Model.from_source(src).session(device="cpu")
    torch.manual_seed(5)
    sq = torch.nn.Linear(4, 4, dtype=torch.complex64)
    rect = torch.nn.Linear(4, 2, dtype=torch.complex64)
    sd = {f"y.linear_0.{k}": v for k, v in sq.state_dict().items()}
    sd.update({f"z.linear_0.{k}": v for k, v in rect.state_dict().items()})
    s.load_state_dict(sd)
    x = (rng.standard_normal((5, 3, 4)) + 1j * rng.standard_normal((5, 3, 4))).astype(np.complex64)
    with torch.no_grad():
        want = rect(sq(torch.from_numpy(x))).numpy()
    np.testing.assert_allclose(s.infer({"x": x})["z"], want, rtol=1e-5, atol=1e-5)
