"""Zero-copy tensor views: any framework's tensor in, any framework's tensor out.

``asview(obj)`` views a tensor or array of any framework (DLPack, the CUDA Array
Interface, NumPy's array interface, the buffer protocol) without copying it;
``from_ptr(ptr, shape, dtype, ...)`` views memory given by its address, checking CUDA
pointers with the driver. A ``View`` exposes ``__dlpack__``, ``__dlpack_device__``, the
CUDA Array Interface (CUDA views) and the array interface (host views), so
``torch.from_dlpack``, ``cupy.from_dlpack``, ``jax.dlpack.from_dlpack``,
``numpy.from_dlpack``, ``numba.cuda.as_cuda_array`` and friends take it as it is. Its
type also publishes the DLPack C exchange API (``__dlpack_c_exchange_api__``), through which
``tvm_ffi.from_dlpack`` and other C consumers take a view without a Python call.

``share(x)`` shares a CUDA tensor of any framework with another process of the same user on
the same machine, zero-copy: the ``Handle`` it returns pickles as a few hundred bytes, and
``open(handle)`` in the other process gives a View of the same memory, ordered after the
producer's pending work on the GPU and kept alive until the consumer lets go.
"""

from ._native import Handle, View, __version__, asview, from_ptr, open, share

__all__ = ["Handle", "View", "asview", "from_ptr", "open", "share", "__version__"]
