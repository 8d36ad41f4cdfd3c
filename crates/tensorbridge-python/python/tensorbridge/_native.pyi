"""Type stubs for the extension module ``tensorbridge._native`` (see ``tensorbridge``)."""

from typing import Any, Callable, Optional, Sequence, Tuple, Union, final

__version__: str

DType = Any
"""A dtype: a name ("float32", "bfloat16", "f4", ...), a NumPy/ml_dtypes dtype or type,
a torch dtype, or one of float, int, bool, complex."""

Device = Union[str, Tuple[int, int], Any]
"""A device: "cpu", "cuda", "cuda:N", a torch device, or a DLPack (device_type, device_id)."""

@final
class View:
    """A zero-copy view of tensor memory someone else owns; keeps that memory alive."""

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
    def dtype(self) -> str:
        """The core dtype name: "float32", "bfloat16", "bool", "complex64", ..."""
    @property
    def device(self) -> str:
        """"cpu", "cuda:0", "cuda_host", "cuda_managed", ..."""
    @property
    def readonly(self) -> bool: ...
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
    def __cuda_array_interface__(self) -> dict:
        """CUDA Array Interface v3 (CUDA, managed and pinned views; AttributeError otherwise)."""
    @property
    def __array_interface__(self) -> dict:
        """NumPy array interface v3 (host views; AttributeError otherwise)."""

def asview(obj: Any, *, stream: Optional[int] = None) -> View:
    """A zero-copy view of any tensor, array, DLPack capsule or buffer."""

def from_ptr(
    ptr: int,
    shape: Sequence[int],
    dtype: DType,
    *,
    strides: Optional[Sequence[int]] = None,
    device: Device = "cuda:0",
    owner: Any = None,
    release: Optional[Callable[[], Any]] = None,
    readonly: bool = False,
    stream: Optional[int] = None,
) -> View:
    """A view of memory given by its address (CUDA pointers are checked by the driver)."""
