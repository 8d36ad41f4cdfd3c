//! PyTorch's stable C shim (the AOTInductor `aoti_torch_*` functions libtorch exports with C
//! linkage): the storage question of the PyTorch import answered in C, with no Python call.
//!
//! # What it answers, and what it does not
//! The import pins a tensor's STORAGE and checks that the storage holds the span the exchange
//! table described (`import::torch`). Through Python that is three calls per tensor
//! (`untyped_storage()`, the storage's `data_ptr()` and its length). Through the shim it is
//! one C++ allocation and three C reads: a storage alias (`aoti_torch__reinterpret_tensor`
//! with no dimensions: a new `at::Tensor` with its own `TensorImpl` holding a reference to the
//! tensor's `StorageImpl`, which is what pins the memory; rebinding the tensor object later
//! changes the object's `TensorImpl`, never the alias's), then the alias's data pointer,
//! storage offset and storage size (`aoti_torch_get_*`). The shim has no function for
//! `requires_grad`, `is_neg()` or `is_conj()`: those are still asked through PyTorch's C
//! methods from Python (docs/BENCHMARKS.md has what they cost).
//!
//! # The tensor inside the object
//! A `torch.Tensor` object is a `THPVariable`, whose first field after the object header is
//! its `at::Tensor` (PyTorch 2.10 to 2.15, read in their headers): the field's address is an
//! `AtenTensorHandle` (cuda.core reads tensors the same way). Nothing here relies on that
//! unverified: the layout is checked once per process (so per PyTorch release), before any
//! shim function touches a tensor, on a probe tensor against PyTorch's own Python answers:
//! the pointer in the field must be the probe's `_cdata` (its `TensorImpl`), then the shim's
//! data pointer, storage offset, storage size and dtype must be the probe's, and so must an
//! alias's. A missing symbol, a type too small to hold the field, or any disagreement turns the
//! shim off for the process: the import asks Python, as before. `TENSORBRIDGE_TORCH_SHIM=0`
//! turns it off too (the tests compare both routes).

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::mem::size_of;
use std::ptr::NonNull;

use crate::ffi::attach::attached;

/// `AOTITorchError`: 0 is success.
type Status = i32;
type Handle = *mut c_void;

/// The shim's functions this module calls, looked up in libtorch (all C linkage, exported
/// since PyTorch 2.3, each catching every C++ exception and returning a status instead).
struct Functions {
    get_data_ptr: unsafe extern "C" fn(Handle, *mut *mut c_void) -> Status,
    get_storage_offset: unsafe extern "C" fn(Handle, *mut i64) -> Status,
    get_storage_size: unsafe extern "C" fn(Handle, *mut i64) -> Status,
    get_dtype: unsafe extern "C" fn(Handle, *mut i32) -> Status,
    dtype_float32: unsafe extern "C" fn() -> i32,
    dtype_element_size: unsafe extern "C" fn(i32) -> usize,
    reinterpret_tensor:
        unsafe extern "C" fn(Handle, i64, *const i64, *const i64, i64, *mut Handle) -> Status,
    delete_tensor_object: unsafe extern "C" fn(Handle) -> Status,
    /// `at::impl::torch_function_mode_enabled()`: not the shim's, a C++ function of no
    /// arguments that reads a thread-local (what `torch._C._is_torch_function_mode_enabled()`
    /// answers), called to leave the import to Python while a mode is on.
    mode_enabled: unsafe extern "C" fn() -> bool,
}

/// The shim, verified for the PyTorch of this process.
pub(crate) struct Shim {
    f: Functions,
}

/// A storage alias: an `at::Tensor` of its own holding a reference to a tensor's storage,
/// deleted once when dropped. Pins the storage's memory wherever the tensor object goes.
pub(crate) struct Alias {
    handle: NonNull<c_void>,
    delete: unsafe extern "C" fn(Handle) -> Status,
}

// SAFETY: an `at::Tensor` is a counted reference to a `TensorImpl` whose count is atomic;
// nothing here reads or writes through it but `delete`, which PyTorch allows from any thread.
unsafe impl Send for Alias {}
// SAFETY: `&Alias` gives no access to the tensor at all.
unsafe impl Sync for Alias {}

impl Drop for Alias {
    fn drop(&mut self) {
        let handle = self.handle.as_ptr();
        let delete = self.delete;
        // With the GIL (the last reference to a storage may run a deleter that takes it:
        // a NumPy array's, through `torch.from_numpy`); when the interpreter is gone the
        // alias is leaked with the process rather than run such a deleter.
        let _ = attached(|_| {
            // SAFETY: `handle` is the alias `reinterpret_tensor` returned, deleted only here.
            unsafe { delete(handle) };
        });
    }
}

/// Where a storage's bytes are: its first byte's address and its size.
pub(crate) struct StorageSpan {
    pub(crate) base: usize,
    pub(crate) len: usize,
}

/// The verified shim, or `None` (the Python route): looked up and verified on first use.
pub(crate) fn shim(py: Python<'_>) -> Option<&'static Shim> {
    // Initialised with the GIL held (`verify` runs Python): a racing thread may verify too,
    // and one result is kept.
    static SHIM: PyOnceLock<Option<Shim>> = PyOnceLock::new();
    SHIM.get_or_init(py, || {
        let off = std::env::var_os("TENSORBRIDGE_TORCH_SHIM").is_some_and(|v| v == "0");
        if off {
            return None;
        }
        // SAFETY: the symbols are looked up by their C names and given their C signatures.
        let f = unsafe { functions() }?;
        let shim = Shim { f };
        verify(py, &shim).ok().filter(|ok| *ok).map(|_| shim)
    })
    .as_ref()
}

impl Shim {
    /// Whether a `TorchFunctionMode` is on for this thread: the import then asks its questions
    /// through Python, where the mode sees them (and a mode's lie is refused there).
    pub(crate) fn mode_on(&self) -> bool {
        // SAFETY: reads this thread's PyTorch thread-local; no argument, no exception.
        unsafe { (self.f.mode_enabled)() }
    }

    /// `obj`'s `at::Tensor`, when `obj` is a `torch.Tensor` (`tensor`, or a subclass).
    fn handle(&self, obj: &Bound<'_, PyAny>, tensor: &Bound<'_, PyType>) -> Option<Handle> {
        // SAFETY: both are live type objects; `PyType_IsSubtype` reads their MROs.
        let is_tensor =
            unsafe { pyo3::ffi::PyType_IsSubtype(obj.get_type_ptr(), tensor.as_type_ptr()) } != 0;
        // The field follows the object header (the layout `verify` checked for this
        // PyTorch): every instance of a `torch.Tensor` subclass starts as a `THPVariable`.
        is_tensor.then(|| {
            obj.as_ptr()
                .cast::<u8>()
                .wrapping_add(size_of::<pyo3::ffi::PyObject>())
                .cast()
        })
    }

    /// A storage alias of `obj` (an instance of `tensor` or a subclass), or `None`: not a
    /// `torch.Tensor`, or a tensor whose storage cannot be reached (PyTorch's error).
    pub(crate) fn alias(
        &self,
        obj: &Bound<'_, PyAny>,
        tensor: &Bound<'_, PyType>,
    ) -> Option<Alias> {
        let handle = self.handle(obj, tensor)?;
        let mut out: Handle = std::ptr::null_mut();
        // SAFETY: `handle` is the `at::Tensor` inside a live tensor object (the layout
        // `verify` checked), valid while `obj` is, which the caller holds; no dimensions (null
        // arrays of length 0); `out` is a live local.
        let rc = unsafe {
            (self.f.reinterpret_tensor)(handle, 0, std::ptr::null(), std::ptr::null(), 0, &mut out)
        };
        if rc != 0 {
            return None;
        }
        NonNull::new(out).map(|handle| Alias {
            handle,
            delete: self.f.delete_tensor_object,
        })
    }

    /// The bytes of `alias`'s storage: the tensor's data pointer less its storage offset in
    /// bytes, and the storage's size.
    pub(crate) fn storage(&self, alias: &Alias) -> Option<StorageSpan> {
        // SAFETY: a live alias (deleted only on drop).
        let facts = unsafe { self.read(alias.handle.as_ptr()) }?;
        let offset_bytes = usize::try_from(facts.offset)
            .ok()?
            .checked_mul(facts.item)?;
        Some(StorageSpan {
            base: facts.data.checked_sub(offset_bytes)?,
            len: usize::try_from(facts.storage).ok()?,
        })
    }

    /// What the shim says of the tensor `h`: `None` when a function fails.
    ///
    /// # Safety
    /// 1. `h` is a live `at::Tensor`.
    unsafe fn read(&self, h: Handle) -> Option<Facts> {
        let (mut data, mut offset, mut storage, mut dtype) = (std::ptr::null_mut(), 0, 0, 0);
        // Each call: obligation 1, and a live local to write to.
        // SAFETY: as above.
        let ok = unsafe { (self.f.get_data_ptr)(h, &mut data) } == 0
            // SAFETY: as above.
            && unsafe { (self.f.get_storage_offset)(h, &mut offset) } == 0
            // SAFETY: as above.
            && unsafe { (self.f.get_storage_size)(h, &mut storage) } == 0
            // SAFETY: as above.
            && unsafe { (self.f.get_dtype)(h, &mut dtype) } == 0;
        // SAFETY: a plain function of a dtype code the shim itself returned.
        let item = unsafe { (self.f.dtype_element_size)(dtype) };
        ok.then_some(Facts {
            data: data as usize,
            offset,
            storage,
            dtype,
            item,
        })
    }
}

/// A tensor as the shim reads it.
struct Facts {
    /// Its data pointer (`data_ptr()`).
    data: usize,
    /// Its storage offset, in elements.
    offset: i64,
    /// Its storage's size in bytes.
    storage: i64,
    /// Its dtype's shim code.
    dtype: i32,
    /// Its element size in bytes.
    item: usize,
}

/// Checks the shim against PyTorch's Python answers on a probe tensor (see the module docs):
/// `Ok(true)` when every answer agrees.
fn verify(py: Python<'_>, shim: &Shim) -> PyResult<bool> {
    let torch = py.import("torch")?;
    let tensor = torch.getattr("Tensor")?.cast_into::<PyType>()?;
    let float32 = torch.getattr("float32")?;
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("dtype", &float32)?;
    // Four by six, the last three rows from the third column: storage offset 8 (32 bytes).
    let probe = torch
        .call_method("arange", (24,), Some(&kwargs))?
        .call_method1("reshape", (4, 6))?
        .get_item((
            pyo3::types::PySlice::new(py, 1, 4, 1),
            pyo3::types::PySlice::new(py, 2, 6, 1),
        ))?;
    let basic: usize = probe.get_type().getattr("__basicsize__")?.extract()?;
    if basic < size_of::<pyo3::ffi::PyObject>() + size_of::<usize>() {
        return Ok(false);
    }
    let impl_ptr: usize = probe.getattr("_cdata")?.extract()?;
    let Some(handle) = shim.handle(&probe, &tensor) else {
        return Ok(false);
    };
    // SAFETY: the object is at least this large (its type's basic size, checked above) and
    // aligned for a pointer (CPython objects are); a plain read of one word of it.
    let field = unsafe { handle.cast::<usize>().read() };
    if field != impl_ptr {
        return Ok(false);
    }
    let data: usize = probe.call_method0("data_ptr")?.extract()?;
    let offset: i64 = probe.call_method0("storage_offset")?.extract()?;
    let nbytes: usize = probe
        .call_method0("untyped_storage")?
        .call_method0("nbytes")?
        .extract()?;
    // SAFETY: `handle` is the probe's `at::Tensor` (its `TensorImpl` pointer checked above),
    // alive while `probe` is.
    let Some(facts) = (unsafe { shim.read(handle) }) else {
        return Ok(false);
    };
    // SAFETY: a plain function returning a dtype code.
    let f32_code = unsafe { (shim.f.dtype_float32)() };
    let agrees = facts.data == data
        && facts.offset == offset
        && usize::try_from(facts.storage).ok() == Some(nbytes)
        && facts.dtype == f32_code
        && facts.item == 4;
    if !agrees {
        return Ok(false);
    }
    // The mode question, against PyTorch's own answer, outside and inside a mode.
    let enabled = py
        .import("torch._C")?
        .getattr("_is_torch_function_mode_enabled")?;
    let before: bool = enabled.call0()?.extract()?;
    if shim.mode_on() != before {
        return Ok(false);
    }
    let mode = py
        .import("torch.overrides")?
        .getattr("TorchFunctionMode")?
        .call0()?;
    mode.call_method0("__enter__")?;
    let inside = shim.mode_on() && enabled.call0()?.extract::<bool>()?;
    let none = py.None();
    mode.call_method1("__exit__", (&none, &none, &none))?;
    if !inside || shim.mode_on() != before {
        return Ok(false);
    }
    let Some(alias) = shim.alias(&probe, &tensor) else {
        return Ok(false);
    };
    Ok(shim
        .storage(&alias)
        .is_some_and(|span| span.base == data - 32 && span.len == nbytes && nbytes == 24 * 4))
}

/// Looks the shim's functions up in the already loaded libtorch (`libtorch_cpu.so`, which
/// `import torch` loaded; never loaded here).
///
/// # Safety
/// 1. A library of that name that exports these names exports PyTorch's shim functions, of
///    the signatures [`Functions`] gives them.
#[cfg(all(unix, not(target_os = "macos")))]
unsafe fn functions() -> Option<Functions> {
    unsafe extern "C" {
        fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
        fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    }
    const RTLD_LAZY: c_int = 0x1;
    const RTLD_NOLOAD: c_int = 0x4;
    // SAFETY: a NUL-terminated name; with RTLD_NOLOAD nothing is loaded or initialised, only
    // a reference to the loaded library taken (kept for the process).
    let lib = unsafe { dlopen(c"libtorch_cpu.so".as_ptr(), RTLD_LAZY | RTLD_NOLOAD) };
    if lib.is_null() {
        return None;
    }
    /// The symbol `name` as the function pointer type `F`.
    ///
    /// # Safety
    /// 1. `lib` is a live library handle; a symbol `name` in it is a function of type `F`.
    unsafe fn load<F: Copy>(lib: *mut c_void, name: &CStr) -> Option<F> {
        const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
        // SAFETY: a live library handle and a NUL-terminated name (obligation 1).
        let p = unsafe { dlsym(lib, name.as_ptr()) };
        // SAFETY: same size (checked above); a function of type `F` (obligation 1).
        (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }
    // Each load: a live handle; obligation 1, each name's C declaration (for the mangled
    // one, `bool at::impl::torch_function_mode_enabled()`, the same calling convention as a C
    // function of no arguments returning `bool`).
    macro_rules! load {
        ($name:literal) => {
            // SAFETY: as above.
            unsafe { load(lib, $name) }?
        };
    }
    Some(Functions {
        get_data_ptr: load!(c"aoti_torch_get_data_ptr"),
        get_storage_offset: load!(c"aoti_torch_get_storage_offset"),
        get_storage_size: load!(c"aoti_torch_get_storage_size"),
        get_dtype: load!(c"aoti_torch_get_dtype"),
        dtype_float32: load!(c"aoti_torch_dtype_float32"),
        dtype_element_size: load!(c"aoti_torch_dtype_element_size"),
        reinterpret_tensor: load!(c"aoti_torch__reinterpret_tensor"),
        delete_tensor_object: load!(c"aoti_torch_delete_tensor_object"),
        mode_enabled: load!(c"_ZN2at4impl27torch_function_mode_enabledEv"),
    })
}

/// Elsewhere (macOS names the library `.dylib`; Windows has no `dlopen`): the Python route.
///
/// # Safety
/// None.
#[cfg(not(all(unix, not(target_os = "macos"))))]
unsafe fn functions() -> Option<Functions> {
    None
}
