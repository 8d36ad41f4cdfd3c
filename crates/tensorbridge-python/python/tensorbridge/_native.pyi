"""Type stubs for the extension module ``tensorbridge._native`` (see ``tensorbridge``).

``tests/test_stubs.py`` checks these signatures against the compiled module's (and
``python -m mypy.stubtest tensorbridge._native`` finds nothing to report).
"""

from typing import Any, Callable, ClassVar, Optional, Sequence, Tuple, Type, Union, final

# For type checkers only: tensorbridge needs neither at run time (where one is missing, its
# types read as unknown and the rest of each union still checks).
import numpy
import torch

__all__ = ["View", "asview", "from_ptr", "Handle", "share", "open", "__version__"]

__version__: str

# Aliases for type checkers (private: the module has no such names at run time).
_DType = Union[
    str,
    numpy.dtype[Any],
    Type[numpy.generic],
    torch.dtype,
    Type[bool],
    Type[int],
    Type[float],
    Type[complex],
]
"""A dtype: a name ("float32", "bfloat16", "f4", "<f8", "d", ...), a NumPy dtype or scalar
type (ml_dtypes' types are NumPy scalar types), a torch dtype, or one of bool, int, float,
complex (NumPy's meaning: int is int64, float float64, complex complex128)."""

_Device = Union[str, Tuple[int, int], torch.device]
"""A device: "cpu", "cuda", "cuda:N", "cuda_host", "cuda_managed", a torch device, or a DLPack
(device_type, device_id) tuple."""

_Stream = Optional[Union[int, Any]]
"""A ``stream=`` argument, read the same way by every function that takes one: ``None``,
DLPack's integers (``-1`` no synchronisation, ``1`` legacy default, ``2`` per-thread default,
a handle; ``0`` is refused as ambiguous) or a stream object (``torch.cuda.Stream``,
``cupy.cuda.Stream``, anything with ``__cuda_stream__``)."""

@final
class View:
    """A zero-copy view of tensor memory someone else owns; keeps that memory alive."""

    __dlpack_c_exchange_api__: ClassVar[Any]
    """The DLPack C exchange API table (DLPack 1.3): a PyCapsule named "dlpack_exchange_api".
    Its current_work_stream is NULL (the legacy default stream) for every device."""
    __c_dlpack_exchange_api__: ClassVar[int]
    """The same table's address (the DLPack 1.2 name)."""

    @property
    def ptr(self) -> int:
        """The address of element 0."""
    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def strides(self) -> Tuple[int, ...]:
        """Strides in elements."""
    @property
    def byte_strides(self) -> Tuple[int, ...]:
        """Strides in bytes."""
    @property
    def dtype(self) -> Union[numpy.dtype[Any], str]:
        """A numpy.dtype where NumPy (or ml_dtypes) has one, else the core name (str);
        str(view.dtype) == view.dtype_name either way."""
    @property
    def dtype_name(self) -> str:
        """The core dtype name: "float32", "bfloat16", "bool", "complex64", "float32x4", ..."""
    @property
    def device(self) -> str:
        """"cpu", "cuda:0", "cuda_host", "cuda_managed", ..."""
    @property
    def readonly(self) -> bool: ...
    @property
    def size(self) -> int:
        """Number of elements."""
    @property
    def nbytes(self) -> int: ...
    @property
    def ndim(self) -> int: ...
    @property
    def itemsize(self) -> int: ...
    def __dlpack__(
        self,
        *,
        stream: Optional[int] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """A DLPack capsule (versioned when max_version >= (1, 0) is asked for)."""
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA Array Interface v3 (CUDA, managed and pinned views; AttributeError otherwise)."""
    @property
    def __array_interface__(self) -> dict[str, Any]:
        """NumPy array interface v3 (host views; AttributeError otherwise)."""

def asview(obj: Any, *, stream: _Stream = None) -> View:
    """A zero-copy view of any tensor, array, DLPack capsule or buffer. ``stream``: the
    CONSUMER's stream (DLPack's integers, ``0`` refused, or a stream object)."""

def from_ptr(
    ptr: int,
    shape: Sequence[int],
    dtype: _DType,
    *,
    strides: Optional[Sequence[int]] = None,
    device: Optional[_Device] = None,
    owner: Any = None,
    release: Optional[Callable[[], Any]] = None,
    readonly: bool = False,
    producer_stream: _Stream = None,
) -> View:
    """A view of memory given by its address (CUDA pointers are checked by the driver).
    ``producer_stream``: the stream the PRODUCER is still writing on (DLPack's integers,
    ``None`` or ``-1`` for nothing pending, or a stream object)."""

@final
class Handle:
    """A share of a CUDA tensor (``share`` makes one, ``open`` takes one): a few hundred
    bytes that pickle as they are. Whoever holds them can map the tensor's whole allocation
    from any process of the same user on the same machine while the share lives."""

    def __init__(self, data: Union[bytes, bytearray, memoryview]) -> None:
        """A handle from its bytes, checked (format, version, checksum, sizes, offsets)."""
    def __bytes__(self) -> bytes: ...
    def __reduce__(self) -> Tuple[Type["Handle"], Tuple[bytes]]: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...
    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def strides(self) -> Tuple[int, ...]:
        """Strides in elements."""
    @property
    def dtype_name(self) -> str: ...
    @property
    def readonly(self) -> bool: ...
    @property
    def device_uuid(self) -> str:
        """The GPU, as ``nvidia-smi -L`` names it."""
    @property
    def producer_pid(self) -> int: ...

def share(obj: Any, *, consumers: int = 1) -> Handle:
    """Shares a CUDA tensor of any framework with other processes, zero-copy. The memory
    stays alive while the handle lives, and after it until ``consumers`` processes have
    opened it and every process that did has released it."""

def open(
    handle: Union[Handle, bytes, bytearray, memoryview], *, stream: _Stream = None
) -> View:
    """A View of a tensor another process shared, on its GPU. ``stream``: the stream this
    process uses the data on (``None``: the legacy default stream)."""
