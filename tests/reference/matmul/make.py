"""Reference values for cvc's batched `MatMul` (compiler/tests/interp.rs, `matmul_batched_vs_numpy`).

Run with any Python that has numpy (e.g. /work/torchenv/bin/python):
    python tests/reference/matmul/make.py
It rewrites `batched.txt` next to it: random operands from a fixed seed and numpy's
`matmul` of them (transposes and conjugations applied explicitly, the summed form by
`.sum` over the leading axes), so the interpreter is checked against an independent
computation. One line per tensor: `NAME DTYPE RANK DIMS... VALUES...` (complex values as
re im pairs, float64 `repr`), after a `case NAME TA TB CA CB SUM` line.
"""

import os

import numpy as np

rng = np.random.default_rng(20261201)

# (name, a dtype, a shape after op, b dtype, b shape after op, trans, conj, sum_batch)
CASES = [
    ("both batched", "c64", (2, 3, 4, 5), "c64", (2, 3, 5, 2), (False, False), (False, False), False),
    ("a transposed, b shared conj", "c64", (4, 3, 5), "c64", (5, 2), (True, False), (False, True), False),
    ("a shared real, b^H batched", "f32", (3, 5), "c64", (2, 3, 5, 2), (False, True), (False, True), False),
    ("summed a^T real b", "c64", (2, 3, 4, 5), "f32", (2, 3, 5, 2), (True, False), (True, False), True),
    ("summed both transposed", "c64", (3, 2, 4), "c64", (3, 4, 3), (True, True), (False, True), True),
    ("real batched", "f32", (3, 2, 4), "f32", (3, 4, 3), (False, False), (False, False), False),
]


def draw(dtype, shape):
    x = rng.standard_normal(shape)
    if dtype == "c64":
        x = x + 1j * rng.standard_normal(shape)
    return x


def swap(x):
    return np.swapaxes(x, -1, -2)


def line(name, dtype, x):
    vals = x.reshape(-1)
    if dtype == "c64":
        flat = [v for z in vals for v in (z.real, z.imag)]
    else:
        flat = list(vals.real)
    dims = " ".join(str(d) for d in x.shape)
    return f"{name} {dtype} {x.ndim} {dims} " + " ".join(repr(float(v)) for v in flat)


out = []
for name, da, sa, db, sb, trans, conj, sum_batch in CASES:
    # The operands as cvc stores them: transposed storage where `trans` is set.
    a_op, b_op = draw(da, sa), draw(db, sb)
    a = swap(a_op) if trans[0] else a_op
    b = swap(b_op) if trans[1] else b_op
    # cvc conjugates the stored operand; conj and transpose commute.
    if conj[0]:
        a = np.conj(a)
    if conj[1]:
        b = np.conj(b)
    ref = np.matmul(a_op, b_op)
    if sum_batch:
        ref = ref.sum(axis=tuple(range(ref.ndim - 2)))
    dc = "c64" if "c64" in (da, db) else "f32"
    flags = " ".join(str(int(f)) for f in (*trans, *conj, sum_batch))
    out.append(f"case {name.replace(' ', '_')} {flags}")
    out.append(line("a", da, a))
    out.append(line("b", db, b))
    out.append(line("out", dc, ref))

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "batched.txt")
with open(path, "w") as f:
    f.write("\n".join(out) + "\n")
