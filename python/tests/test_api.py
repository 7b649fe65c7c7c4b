"""The Python API mirrors the embedding API: models, tables, plans, sessions, steps."""

from pathlib import Path

import numpy as np
import pytest

import cvc
from conftest import PARITY_SRC, parity_batch, tiny_batch

ROOT = Path(__file__).resolve().parents[2]


def test_from_file_reads_an_example():
    m = cvc.Model.from_file(ROOT / "examples" / "rf_modulation.cvnn")
    assert m.name == "RfClassifier"
    assert m.batch == 128
    names = [i["name"] for i in m.inputs]
    assert names == ["iq", "label"]
    iq = m.inputs[0]
    assert iq["dtype"] == "complex64" and iq["shape"] == ["B", 1, 512] and iq["classes"] is None
    assert m.inputs[1]["classes"] == 5


def test_check_is_the_layer_table(parity_model):
    table = parity_model.check()
    ops = [row["label"].split("/")[-1] for row in table if "/" in row["label"]]
    assert ops == ["conv1d", "modrelu", "flatten", "linear", "abs", "cross_entropy"]
    conv = next(r for r in table if r["label"] == "logits/conv1d")
    # conv1d(4, kernel 3) on 2 channels: 4*2*3 weights + 4 biases, complex.
    assert conv["params_complex"] == 4 * 2 * 3 + 4
    assert conv["shape"] == ["B", 4, 16]
    assert conv["line"] == PARITY_SRC.splitlines().index(
        next(l for l in PARITY_SRC.splitlines() if "conv1d" in l)) + 1


def test_plan_names_the_tensors_alive_at_the_peak(parity_model):
    plan = parity_model.plan(batch=8)
    assert plan["batch"] == 8
    assert plan["arena_bytes"] >= plan["lower_bound_bytes"] > 0
    live = plan["live_at_peak"]
    assert live and all({"bytes", "kind", "label", "line"} <= set(t) for t in live)
    lines = PARITY_SRC.splitlines()
    for t in live:
        if t["line"]:
            assert 1 <= t["line"] <= len(lines)
    # The arena grows with the batch; the planner's lower bound does too.
    bigger = parity_model.plan(batch=32)
    assert bigger["lower_bound_bytes"] > plan["lower_bound_bytes"]
    assert parity_model.plan(batch=8, mode="eval")["mode"] == "eval"


def test_training_fits_a_fixed_batch(tiny_model, rng):
    s = tiny_model.session(device="cpu")
    assert s.device == "cpu" and s.batch == 8
    batch = tiny_batch(rng)
    first = s.train_step(batch)
    assert isinstance(first.loss, float)
    assert set(first.metrics) == {"accuracy", "correct", "count"} and first.metrics["count"] == 8
    assert first.outputs["logits"].shape == (8, 2) and first.outputs["logits"].dtype == np.float32
    for _ in range(40):
        last = s.train_step(batch)
    assert last.loss < 0.8 * first.loss


def test_metrics_count_correct_predictions(tiny_model, rng):
    s = tiny_model.session(device="cpu")
    batch = tiny_batch(rng)
    r = s.train_step(batch)
    # The step's outputs are the logits before the update: recount from them.
    pred = r.outputs["logits"].argmax(axis=1)
    assert r.metrics["correct"] == int((pred == batch["label"]).sum())


def test_infer_and_evaluate_take_any_batch_size(parity_model, rng):
    s = parity_model.session(device="cpu")
    b = parity_batch(rng, 5)
    out = s.infer({"x": b["x"]})
    assert out["logits"].shape == (5, 3)
    ev = s.evaluate(b)
    assert ev["loss"] is not None and ev["metrics"]["count"] == 5
    np.testing.assert_array_equal(ev["outputs"]["logits"], out["logits"])
    # Without labels there is no loss.
    assert s.evaluate({"x": b["x"]})["loss"] is None


def test_cpu_matches_the_f64_interpreter(parity_model, rng):
    cpu = parity_model.session(device="cpu")
    ref = parity_model.session(device="interp")
    ref.load_state_dict(cpu.state_dict())
    b = parity_batch(rng)
    a, r = cpu.train_step(b), ref.train_step(b)
    assert abs(a.loss - r.loss) <= 1e-5 * max(1.0, abs(r.loss))
    np.testing.assert_allclose(a.outputs["logits"], r.outputs["logits"], rtol=1e-4, atol=1e-5)
    for k, v in ref.state_dict().items():
        np.testing.assert_allclose(cpu.state_dict()[k], v, rtol=1e-4, atol=1e-5, err_msg=k)


def test_gradients_leave_the_parameters_alone(parity_model, rng):
    s = parity_model.session(device="cpu")
    b = parity_batch(rng)
    before = s.state_dict(optimizer=True)
    g1 = s.gradients(b)
    after = s.state_dict(optimizer=True)
    assert before.keys() == after.keys()
    for k in before:
        np.testing.assert_array_equal(before[k], after[k], err_msg=k)
    assert set(g1) == set(s.state_dict())  # this model has parameters only
    g2 = s.gradients(b)
    for k in g1:
        np.testing.assert_array_equal(g1[k], g2[k])
    # A step's update is -lr * gradient under plain SGD.
    s.train_step(b)
    for k, v in s.state_dict().items():
        np.testing.assert_allclose(v, before[k] - 0.05 * g1[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_gradients_match_finite_differences(tiny_model, rng):
    s = tiny_model.session(device="interp")
    b = tiny_batch(rng)
    g = s.gradients(b)["logits.linear_0.bias"]
    sd = s.state_dict()
    h = 1e-3

    def loss_at(delta):
        d = dict(sd)
        d["logits.linear_0.bias"] = (sd["logits.linear_0.bias"] + delta).astype(np.complex64)
        s.load_state_dict(d)
        return s.evaluate(b)["loss"]

    for j in range(2):
        e = np.zeros(2, np.complex64)
        e[j] = h
        d_re = (loss_at(e) - loss_at(-e)) / (2 * h)
        d_im = (loss_at(1j * e) - loss_at(-1j * e)) / (2 * h)
        # PyTorch's convention: dL/dRe + i dL/dIm.
        assert abs(g[j] - (d_re + 1j * d_im)) < 2e-3, (j, g[j], d_re, d_im)


def test_learning_rate_is_settable(tiny_model):
    s = tiny_model.session(device="cpu")
    assert s.lr == pytest.approx(0.05)
    s.lr = 0.01
    assert s.lr == pytest.approx(0.01)


def test_session_options(tiny_model):
    s = tiny_model.session(device="cpu", batch=4, seed=9)
    assert s.batch == 4
    other = tiny_model.session(device="cpu", batch=4, seed=10)
    a, b = s.state_dict(), other.state_dict()
    assert not np.array_equal(a["logits.linear_0.weight"], b["logits.linear_0.weight"])
    with pytest.raises(ValueError, match="device"):
        tiny_model.session(device="tpu")
    with pytest.raises(ValueError, match="precision"):
        tiny_model.session(device="cpu", precision="fp8")
    # 16-bit precisions are for the GPU; on the CPU the session computes in f32.
    half = tiny_model.session(device="cpu", batch=4, seed=9, precision="bf16")
    assert np.array_equal(half.state_dict()["logits.linear_0.weight"], a["logits.linear_0.weight"])
    with pytest.raises(ValueError, match="batch"):
        tiny_model.session(device="cpu", batch=0)


def test_auto_without_a_gpu_says_why():
    if cvc.cuda_available():
        pytest.skip("a GPU is usable here")
    s = cvc.Model.from_source(PARITY_SRC).session(device="auto")
    assert s.device == "cpu" and "CUDA" in s.note
    with pytest.raises(cvc.Error, match="no usable CUDA GPU"):
        cvc.Model.from_source(PARITY_SRC).session(device="cuda")


def test_session_plan_is_the_training_plan(parity_model):
    s = parity_model.session(device="cpu")
    assert s.plan()["arena_bytes"] == parity_model.plan()["arena_bytes"]
