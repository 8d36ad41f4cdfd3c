//! The C ABI of the shim (`shim/tensorbridge_tch.cpp`) and libtorch's integer codes.
//!
//! libtorch's codes (`c10::ScalarType`, `c10::DeviceType`, `c10::Layout`, all `int8_t`) enter
//! as newtypes with constants, never as Rust enums: a code this version does not know is a
//! value to report, not undefined behaviour. The `#[repr(C)]` struct the shim fills in is
//! asserted against the C++ side's size here and there (`static_assert` in the shim).

use std::ffi::{CStr, c_char, c_void};
use std::fmt;
use std::mem::{offset_of, size_of};

use torch_sys::C_tensor;

/// A libtorch element type code (`c10::ScalarType`), as libtorch 2.11 numbers them.
///
/// tch 0.24 keeps its own mapping of [`tch::Kind`] to these codes private, and its `Kind`
/// lacks several of them (the unsigned 16/32/64-bit types, `Float8_e8m0fnu`,
/// `Float4_e2m1fn_x2`); this crate reads and writes the codes itself.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct ScalarType(pub i8);

impl ScalarType {
    /// `Byte`: `uint8`.
    pub const BYTE: ScalarType = ScalarType(0);
    /// `Char`: `int8`.
    pub const CHAR: ScalarType = ScalarType(1);
    /// `Short`: `int16`.
    pub const SHORT: ScalarType = ScalarType(2);
    /// `Int`: `int32`.
    pub const INT: ScalarType = ScalarType(3);
    /// `Long`: `int64`.
    pub const LONG: ScalarType = ScalarType(4);
    /// `Half`: IEEE `float16`.
    pub const HALF: ScalarType = ScalarType(5);
    /// `Float`: `float32`.
    pub const FLOAT: ScalarType = ScalarType(6);
    /// `Double`: `float64`.
    pub const DOUBLE: ScalarType = ScalarType(7);
    /// `ComplexHalf`: two `float16`.
    pub const COMPLEX_HALF: ScalarType = ScalarType(8);
    /// `ComplexFloat`: two `float32`.
    pub const COMPLEX_FLOAT: ScalarType = ScalarType(9);
    /// `ComplexDouble`: two `float64`.
    pub const COMPLEX_DOUBLE: ScalarType = ScalarType(10);
    /// `Bool`: one byte.
    pub const BOOL: ScalarType = ScalarType(11);
    /// `QInt8`: quantized, no DLPack code.
    pub const QINT8: ScalarType = ScalarType(12);
    /// `QUInt8`: quantized, no DLPack code.
    pub const QUINT8: ScalarType = ScalarType(13);
    /// `QInt32`: quantized, no DLPack code.
    pub const QINT32: ScalarType = ScalarType(14);
    /// `BFloat16`.
    pub const BFLOAT16: ScalarType = ScalarType(15);
    /// `Float8_e5m2`.
    pub const FLOAT8_E5M2: ScalarType = ScalarType(23);
    /// `Float8_e4m3fn`.
    pub const FLOAT8_E4M3FN: ScalarType = ScalarType(24);
    /// `Float8_e5m2fnuz`.
    pub const FLOAT8_E5M2FNUZ: ScalarType = ScalarType(25);
    /// `Float8_e4m3fnuz`.
    pub const FLOAT8_E4M3FNUZ: ScalarType = ScalarType(26);
    /// `UInt16`.
    pub const UINT16: ScalarType = ScalarType(27);
    /// `UInt32`.
    pub const UINT32: ScalarType = ScalarType(28);
    /// `UInt64`.
    pub const UINT64: ScalarType = ScalarType(29);
    /// `Float8_e8m0fnu`: the MX scale format.
    pub const FLOAT8_E8M0FNU: ScalarType = ScalarType(44);
    /// `Float4_e2m1fn_x2`: two packed fp4 values per byte, one element.
    pub const FLOAT4_E2M1FN_X2: ScalarType = ScalarType(45);

    /// libtorch's name for the code (`"Float"`, `"QInt8"`...), or `None` for a code libtorch
    /// 2.11 does not define.
    pub fn name(self) -> Option<&'static str> {
        const NAMES: [&str; 46] = [
            "Byte",
            "Char",
            "Short",
            "Int",
            "Long",
            "Half",
            "Float",
            "Double",
            "ComplexHalf",
            "ComplexFloat",
            "ComplexDouble",
            "Bool",
            "QInt8",
            "QUInt8",
            "QInt32",
            "BFloat16",
            "QUInt4x2",
            "QUInt2x4",
            "Bits1x8",
            "Bits2x4",
            "Bits4x2",
            "Bits8",
            "Bits16",
            "Float8_e5m2",
            "Float8_e4m3fn",
            "Float8_e5m2fnuz",
            "Float8_e4m3fnuz",
            "UInt16",
            "UInt32",
            "UInt64",
            "UInt1",
            "UInt2",
            "UInt3",
            "UInt4",
            "UInt5",
            "UInt6",
            "UInt7",
            "Int1",
            "Int2",
            "Int3",
            "Int4",
            "Int5",
            "Int6",
            "Int7",
            "Float8_e8m0fnu",
            "Float4_e2m1fn_x2",
        ];
        usize::try_from(self.0)
            .ok()
            .and_then(|i| NAMES.get(i).copied())
    }
}

impl fmt::Display for ScalarType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} ({})", self.0),
            None => write!(f, "unknown scalar type {}", self.0),
        }
    }
}

impl fmt::Debug for ScalarType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ScalarType({self})")
    }
}

/// A libtorch device type code (`c10::DeviceType`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct TorchDeviceType(pub i8);

impl TorchDeviceType {
    /// `CPU`.
    pub const CPU: TorchDeviceType = TorchDeviceType(0);
    /// `CUDA`.
    pub const CUDA: TorchDeviceType = TorchDeviceType(1);
    /// `Meta`: tensors without data.
    pub const META: TorchDeviceType = TorchDeviceType(14);

    /// libtorch's name for the type (`"cpu"`, `"cuda"`, `"meta"`...), as in `"cuda:0"`, or
    /// `None` for a code libtorch 2.11 does not define.
    pub fn name(self) -> Option<&'static str> {
        const NAMES: [&str; 21] = [
            "cpu",
            "cuda",
            "mkldnn",
            "opengl",
            "opencl",
            "ideep",
            "hip",
            "fpga",
            "maia",
            "xla",
            "vulkan",
            "metal",
            "xpu",
            "mps",
            "meta",
            "hpu",
            "ve",
            "lazy",
            "ipu",
            "mtia",
            "privateuseone",
        ];
        usize::try_from(self.0)
            .ok()
            .and_then(|i| NAMES.get(i).copied())
    }
}

impl fmt::Display for TorchDeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "unknown device type {}", self.0),
        }
    }
}

impl fmt::Debug for TorchDeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TorchDeviceType({self})")
    }
}

/// A libtorch device: type and index (`c10::Device`), displayed as libtorch does (`cuda:0`,
/// `meta`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TorchDevice {
    /// The device type.
    pub kind: TorchDeviceType,
    /// The index, -1 when the device has none.
    pub index: i8,
}

impl fmt::Display for TorchDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.index < 0 {
            write!(f, "{}", self.kind)
        } else {
            write!(f, "{}:{}", self.kind, self.index)
        }
    }
}

/// A libtorch memory layout code (`c10::Layout`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct TorchLayout(pub i8);

impl TorchLayout {
    /// `torch.strided`: dense memory with strides, the only layout that can be shared.
    pub const STRIDED: TorchLayout = TorchLayout(0);

    /// libtorch's Python name for the layout (`"torch.sparse_coo"`...), or `None` for a code
    /// libtorch 2.11 does not define.
    pub fn name(self) -> Option<&'static str> {
        const NAMES: [&str; 8] = [
            "torch.strided",
            "torch.sparse_coo",
            "torch.sparse_csr",
            "torch._mkldnn",
            "torch.sparse_csc",
            "torch.sparse_bsr",
            "torch.sparse_bsc",
            "torch.jagged",
        ];
        usize::try_from(self.0)
            .ok()
            .and_then(|i| NAMES.get(i).copied())
    }
}

impl fmt::Display for TorchLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "unknown layout {}", self.0),
        }
    }
}

impl fmt::Debug for TorchLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TorchLayout({self})")
    }
}

/// What `tb_tch_describe` reports of a tensor (the shim's `tb_tch_info`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct TensorInfo {
    /// Address of element 0; null for some tensors without elements.
    pub(crate) data: *mut c_void,
    /// `ndim` extents, borrowed from the tensor.
    pub(crate) sizes: *const i64,
    /// `ndim` strides in elements, borrowed from the tensor.
    pub(crate) strides: *const i64,
    pub(crate) ndim: i64,
    /// In elements.
    pub(crate) storage_offset: i64,
    /// Bytes per element.
    pub(crate) itemsize: i64,
    pub(crate) scalar_type: ScalarType,
    pub(crate) device_type: TorchDeviceType,
    pub(crate) device_index: i8,
    pub(crate) layout: TorchLayout,
    /// 0 for an undefined tensor, of which nothing else was filled in.
    pub(crate) defined: u8,
    pub(crate) is_conj: u8,
    pub(crate) is_neg: u8,
    pub(crate) reserved: u8,
    /// One reference to the tensor's `c10::StorageImpl`, taken only when the call succeeded
    /// for a defined strided tensor (null otherwise); the caller owns it and gives it back
    /// with [`tb_tch_storage_release`], exactly once.
    pub(crate) storage: *mut c_void,
}

impl TensorInfo {
    pub(crate) const fn zeroed() -> TensorInfo {
        TensorInfo {
            data: std::ptr::null_mut(),
            sizes: std::ptr::null(),
            strides: std::ptr::null(),
            ndim: 0,
            storage_offset: 0,
            itemsize: 0,
            scalar_type: ScalarType(0),
            device_type: TorchDeviceType(0),
            device_index: -1,
            layout: TorchLayout(0),
            defined: 0,
            is_conj: 0,
            is_neg: 0,
            reserved: 0,
            storage: std::ptr::null_mut(),
        }
    }
}

// The shim's `static_assert(sizeof(tb_tch_info) == 64)` and the C layout rules fix the rest.
const _: () = {
    assert!(size_of::<TensorInfo>() == 64);
    assert!(offset_of!(TensorInfo, ndim) == 24);
    assert!(offset_of!(TensorInfo, itemsize) == 40);
    assert!(offset_of!(TensorInfo, scalar_type) == 48);
    assert!(offset_of!(TensorInfo, layout) == 51);
    assert!(offset_of!(TensorInfo, reserved) == 55);
    assert!(offset_of!(TensorInfo, storage) == 56);
    assert!(size_of::<ScalarType>() == 1);
    assert!(size_of::<TorchDeviceType>() == 1);
    assert!(size_of::<TorchLayout>() == 1);
};

/// The context deleter `tb_tch_from_blob` hands to libtorch.
pub(crate) type Release = unsafe extern "C" fn(ctx: *mut c_void);

// Each function returns 0 on success. On failure it returns 1 and stores a message in `*err`
// (null if even the message could not be allocated), which `tb_tch_free_error` frees. None of
// them unwinds: every C++ exception is caught inside.
unsafe extern "C" {
    /// Frees a message from `err`; null is allowed.
    pub(crate) fn tb_tch_free_error(err: *mut c_char);

    /// Describes `t` into `out`; `sizes` and `strides` borrow the tensor's own arrays. On
    /// success for a defined strided tensor, `out.storage` is a reference to its storage
    /// the caller must release (and on failure, null).
    pub(crate) fn tb_tch_describe(
        t: *const C_tensor,
        out: *mut TensorInfo,
        err: *mut *mut c_char,
    ) -> i32;

    /// Gives back a storage reference `tb_tch_describe` took (null is allowed); may free the
    /// storage. Never unwinds.
    pub(crate) fn tb_tch_storage_release(storage: *mut c_void);

    /// The reference count of `t`'s storage, -1 for a tensor without one.
    #[cfg(test)]
    pub(crate) fn tb_tch_storage_use_count(t: *const C_tensor) -> i64;

    /// libtorch's current stream of a device on the calling thread, as a native handle (a
    /// `cudaStream_t` for CUDA; null for the legacy default stream).
    pub(crate) fn tb_tch_current_stream(
        device_type: TorchDeviceType,
        device_index: i8,
        out: *mut *mut c_void,
        err: *mut *mut c_char,
    ) -> i32;

    /// [`tb_tch_current_stream`], with libtorch's `StreamId` for the stream in `*id` (0: the
    /// default stream; odd: a stream of libtorch's pools; even and nonzero: an external
    /// stream, whose id is its handle).
    pub(crate) fn tb_tch_current_stream_id(
        device_type: TorchDeviceType,
        device_index: i8,
        out: *mut *mut c_void,
        id: *mut i64,
        err: *mut *mut c_char,
    ) -> i32;

    /// `at::for_blob(data, sizes).context(ctx, release).strides(strides)...make_tensor()`,
    /// as a new heap tensor in `*out`. `ctx` is released exactly once on every path: by
    /// libtorch when the storage is freed, or before a failing call returns.
    #[allow(clippy::too_many_arguments)] // One C call, mirroring `at::for_blob`'s settings.
    pub(crate) fn tb_tch_from_blob(
        data: *mut c_void,
        sizes: *const i64,
        strides: *const i64,
        ndim: i64,
        scalar_type: ScalarType,
        device_type: TorchDeviceType,
        device_index: i8,
        ctx: *mut c_void,
        release: Release,
        out: *mut *mut C_tensor,
        err: *mut *mut c_char,
    ) -> i32;

    /// libtorch's own `at::toDLPackVersioned(*t)`: a `DLManagedTensorVersioned*` that holds a
    /// reference to `t`'s storage until its deleter runs.
    #[cfg(test)]
    pub(crate) fn tb_tch_to_dlpack_versioned(
        t: *const C_tensor,
        out: *mut *mut c_void,
        err: *mut *mut c_char,
    ) -> i32;
}

/// Turns a shim status and message into a result, freeing the message.
///
/// # Safety
/// 1. `err` is what the shim call that returned `status` stored: null or a message it
///    allocated, not freed yet.
pub(crate) unsafe fn check(
    call: &'static str,
    status: i32,
    err: *mut c_char,
) -> Result<(), crate::Error> {
    if status == 0 {
        return Ok(());
    }
    let message = if err.is_null() {
        "libtorch failed and its message could not be copied".to_owned()
    } else {
        // SAFETY: a NUL-terminated string the shim copied (obligation 1), alive until freed
        // below.
        let text = unsafe { CStr::from_ptr(err) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: allocated by the shim and freed exactly once, here (obligation 1).
        unsafe { tb_tch_free_error(err) };
        text
    };
    Err(crate::Error::Torch { call, message })
}
