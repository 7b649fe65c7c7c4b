"""Type stubs of the cvc package (the extension module ``cvc._cvc``, re-exported)."""

from os import PathLike
from typing import Any, Dict, List, Literal, Mapping, Optional, Tuple, Union



__version__: str

#: A batch: input name → array (NumPy array, PyTorch tensor, or anything NumPy reads).
Batch = Mapping[str, Any]
#: A plan or layer-table entry as plain Python data (what ``cvc plan --json`` prints).
Json = Any

class Error(RuntimeError):
    """Base class of the errors cvc raises."""

class CompileError(Error):
    """A ``.cvnn`` model was rejected. ``str(e)`` is the rendered report with source excerpts."""

    #: The file name the model was built with.
    file: str
    #: 1-based line of the first diagnostic.
    line: int
    #: 1-based column of the first diagnostic.
    column: int

class DataError(Error):
    """An input, state dict or checkpoint does not fit the model; the message names the tensor
    and the expected shape and dtype."""

def cuda_available() -> bool:
    """Whether a CUDA driver and GPU are usable by cvc (what ``device="auto"`` checks)."""

def staging_copies() -> int:
    """How many inputs were copied (converted, made contiguous, or moved between host and
    device) before upload since ``cvc`` was imported; inputs read in place do not count."""

class Model:
    """A checked ``.cvnn`` model: its training and inference graphs and its ``train`` section."""

    @staticmethod
    def from_file(path: Union[str, "PathLike[str]"]) -> "Model":
        """Reads and checks a ``.cvnn`` file; raises ``CompileError`` on a rejected model."""
    @staticmethod
    def from_source(text: str, name: str = "<string>") -> "Model":
        """Checks ``.cvnn`` source text; ``name`` is the file name diagnostics show."""
    @property
    def name(self) -> str:
        """The model's name."""
    @property
    def file(self) -> str:
        """The file name given when the model was built."""
    @property
    def inputs(self) -> List[Dict[str, Any]]:
        """The inputs of a training step: dicts with ``name``, ``dtype`` (NumPy's name),
        ``shape`` (``"B"`` for the batch) and ``classes`` (labels) or None."""
    @property
    def batch(self) -> int:
        """The ``train`` section's batch size (its default when the file has none)."""
    def check(self) -> List[Dict[str, Any]]:
        """The layer table: dicts with ``label``, ``op``, ``shape``, ``dtype``,
        ``params_complex``, ``params_real`` and ``line``."""
    def plan(
        self,
        batch: Optional[int] = None,
        mode: Literal["train", "eval"] = "train",
        memory_budget: Optional[int] = None,
    ) -> Dict[str, Json]:
        """The static memory plan: ``arena_bytes``, ``lower_bound_bytes``, ``live_at_peak``
        (tensors with ``bytes``, ``kind``, ``label`` and ``.cvnn`` ``line``), kernels, passes."""
    def session(
        self,
        device: Literal["auto", "cpu", "cuda", "interp"] = "auto",
        batch: Optional[int] = None,
        precision: Optional[Literal["fp32", "tf32"]] = None,
        seed: Optional[int] = None,
        memory_budget: Optional[int] = None,
    ) -> "Session":
        """A session on ``device`` with training steps of ``batch`` rows; unset arguments come
        from the ``train`` section."""

class StepResult:
    """What a training step returned."""

    #: The batch's loss, computed before the optimizer update.
    loss: float
    #: ``accuracy``, ``correct`` and ``count`` for a classifier, else empty.
    metrics: Dict[str, float]
    #: The model's outputs by name (NumPy arrays, or torch tensors with ``as_torch=True``).
    outputs: Dict[str, Any]

class Session:
    """A model's parameters and state on one device, with its compiled programs."""

    @property
    def device(self) -> str:
        """The back end: ``cpu``, ``cuda:<gpu>`` or ``interp``."""
    @property
    def batch(self) -> int:
        """The batch size of training steps."""
    @property
    def note(self) -> Optional[str]:
        """Why ``device="auto"`` chose the CPU, if it did."""
    @property
    def lr(self) -> float:
        """The learning rate of the following steps (settable)."""
    @lr.setter
    def lr(self, value: float) -> None: ...
    @property
    def model(self) -> Model:
        """The model this session runs."""
    @property
    def measured_peak_bytes(self) -> Optional[int]:
        """Measured peak memory of the training back end in bytes, when known."""
    def train_step(self, batch: Batch, as_torch: bool = False) -> StepResult:
        """One training step (forward, loss, backward, update) on ``session.batch`` rows."""
    def evaluate(self, batch: Batch, as_torch: bool = False) -> Dict[str, Any]:
        """Inference on a batch of any size: ``loss`` (None without labels), ``metrics``,
        ``outputs``."""
    def infer(self, batch: Batch, as_torch: bool = False) -> Dict[str, Any]:
        """The model's outputs for a batch of any size (inference mode); labels optional."""
    def gradients(self, batch: Batch, as_torch: bool = False) -> Dict[str, Any]:
        """The loss's gradient for every parameter at the current parameters, in PyTorch's
        names and layouts; the session's parameters and state are left unchanged."""
    def state_dict(self, optimizer: bool = False, as_torch: bool = False) -> Dict[str, Any]:
        """Parameters and layer buffers by PyTorch name, in PyTorch's layouts;
        ``optimizer=True`` adds the optimizer state."""
    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> None:
        """Loads a state dict (``state_dict()``'s names and layouts, e.g. from PyTorch)."""
    def save(self, path: Union[str, "PathLike[str]"], metadata: Optional[Mapping[str, str]] = None) -> None:
        """Writes parameters and state to a safetensors file, atomically."""
    def load(self, path: Union[str, "PathLike[str]"]) -> Dict[str, str]:
        """Loads parameters and state from a safetensors file; returns its metadata."""
    def plan(self) -> Dict[str, Json]:
        """The training program's memory plan (as ``Model.plan`` gives it)."""
    def _last_input_addresses(self) -> Dict[str, Tuple[str, int]]:
        """For tests: where each input of the last call was read from (place, address)."""

__all__: List[str]

