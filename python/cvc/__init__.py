"""cvc: a compiler for complex-valued neural networks, from Python.

Compile a ``.cvnn`` model, open a session on the CPU or a CUDA GPU, and train it on batches
of NumPy arrays or PyTorch tensors::

    import cvc
    model = cvc.Model.from_file("examples/rf_modulation.cvnn")
    session = model.session(device="auto")
    result = session.train_step({"iq": iq, "label": labels})
    print(result.loss, result.metrics)

See ``python/README.md`` for the API, the zero-copy rules and the PyTorch state-dict names.
"""

from ._cvc import (
    CompileError,
    DataError,
    Error,
    Model,
    Session,
    StepResult,
    __version__,
    cuda_available,
    staging_copies,
)

__all__ = [
    "CompileError",
    "DataError",
    "Error",
    "Model",
    "Session",
    "StepResult",
    "__version__",
    "cuda_available",
    "staging_copies",
]
