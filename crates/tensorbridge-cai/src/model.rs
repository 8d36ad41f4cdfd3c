//! The two interfaces as plain values: what a Python layer reads out of the dict, and what it
//! puts back into one. Nothing here is checked; [`crate::CudaArrayInterface::import`] and
//! [`crate::ArrayInterface::import`] are the trust boundary.

use std::fmt;

use crate::TypeStr;

/// The `data` tuple `(address, readonly)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct DataPointer {
    /// Address of element 0 (CAI: device-accessible). 0 only for zero-size arrays.
    pub address: usize,
    /// Whether consumers must not write.
    pub readonly: bool,
}

/// One entry of a `descr` list: `(name, format)` or `(name, format, shape)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DescrField {
    /// The field name; `''` for unnamed fields and padding. (A NumPy `(title, name)` pair
    /// is given by its name.)
    pub name: String,
    /// A typestr, or the fields of a nested structure.
    pub format: DescrFormat,
    /// The sub-array shape of the field, when it has one.
    pub shape: Option<Vec<i64>>,
}

/// The second element of a [`DescrField`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DescrFormat {
    /// A plain typestr.
    TypeStr(TypeStr),
    /// A nested structure.
    Fields(Vec<DescrField>),
}

/// Prints a `descr` list as Python writes it: `[('', '<f4')]`.
pub(crate) struct DescrDisplay<'a>(pub(crate) &'a [DescrField]);

impl fmt::Display for DescrDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, field) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "('{}', ", field.name)?;
            match &field.format {
                DescrFormat::TypeStr(t) => write!(f, "'{t}'")?,
                DescrFormat::Fields(nested) => write!(f, "{}", DescrDisplay(nested))?,
            }
            if let Some(shape) = &field.shape {
                // A Python tuple: `(2, 3)`, `(2,)`.
                let dims: Vec<String> = shape.iter().map(i64::to_string).collect();
                let comma = if dims.len() == 1 { "," } else { "" };
                write!(f, ", ({}{comma})", dims.join(", "))?;
            }
            f.write_str(")")?;
        }
        f.write_str("]")
    }
}

/// `obj.__cuda_array_interface__` (CUDA Array Interface v3, and versions 0 to 2 on import).
///
/// Fields mirror the dict's keys; integers are the raw Python values. Absent optional keys
/// are `None` (or `false` for `mask`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaArrayInterface {
    /// `shape`: extents.
    pub shape: Vec<i64>,
    /// `typestr`.
    pub typestr: TypeStr,
    /// `data`: `(address, readonly)`.
    pub data: DataPointer,
    /// `strides`: strides **in bytes**; `None` (or absent) means compact C order.
    pub strides: Option<Vec<i64>>,
    /// `descr`; `None` when absent.
    pub descr: Option<Vec<DescrField>>,
    /// Whether `mask` is present and not `None`.
    pub mask: bool,
    /// `version`.
    pub version: i64,
    /// `stream`: the raw integer, `None` for Python `None` or an absent key (see
    /// [`tensorbridge_core::stream_from_wire`] with
    /// [`StreamConvention::CudaArrayInterface`](tensorbridge_core::StreamConvention::CudaArrayInterface)).
    pub stream: Option<i64>,
}

/// `data` of `__array_interface__`: a pointer tuple, or a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArrayData {
    /// The `(address, readonly)` tuple: the address of element 0; `offset` is ignored.
    Pointer(DataPointer),
    /// `data` was `None` or absent (the exporting object's own buffer) or an object exposing
    /// the buffer protocol: the Python layer resolves that buffer and passes its region here.
    /// Element 0 lies `offset` bytes into it, and every element must lie inside it.
    Buffer(BufferRegion),
}

/// A buffer obtained through the buffer protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufferRegion {
    /// Address of the buffer's first byte.
    pub address: usize,
    /// Length of the buffer in bytes.
    pub len: usize,
    /// Whether the buffer is read-only.
    pub readonly: bool,
}

/// `obj.__array_interface__` (NumPy array interface v3): host memory.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ArrayInterface {
    /// `shape`: extents.
    pub shape: Vec<i64>,
    /// `typestr`.
    pub typestr: TypeStr,
    /// `data`.
    pub data: ArrayData,
    /// `strides`: strides **in bytes**; `None` (or absent) means compact C order.
    pub strides: Option<Vec<i64>>,
    /// `descr`; `None` when absent.
    pub descr: Option<Vec<DescrField>>,
    /// Whether `mask` is present and not `None`.
    pub mask: bool,
    /// `offset`: bytes from the start of a [`ArrayData::Buffer`] to element 0; 0 when absent.
    pub offset: i64,
    /// `version`.
    pub version: i64,
}

/// Which interface a message is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Interface {
    /// `__cuda_array_interface__`.
    Cuda,
    /// NumPy's `__array_interface__`.
    Array,
}

impl Interface {
    /// The devices it can describe, for messages.
    pub(crate) const fn expected_devices(self) -> &'static str {
        match self {
            Interface::Cuda => "cuda, cuda_managed or cuda_host",
            Interface::Array => "cpu, cuda_host or rocm_host",
        }
    }
}

impl fmt::Display for Interface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Interface::Cuda => "the CUDA Array Interface",
            Interface::Array => "the NumPy array interface",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ByteOrder, TypeKind};

    #[test]
    fn descr_prints_like_python() {
        let f4 = TypeStr::new(ByteOrder::Little, TypeKind::Float, 4);
        assert_eq!(
            DescrDisplay(&f4.default_descr()).to_string(),
            "[('', '<f4')]"
        );
        let nested = vec![
            DescrField {
                name: "a".into(),
                format: DescrFormat::TypeStr(f4),
                shape: Some(vec![2, 3]),
            },
            DescrField {
                name: "b".into(),
                format: DescrFormat::Fields(f4.default_descr()),
                shape: None,
            },
        ];
        assert_eq!(
            DescrDisplay(&nested).to_string(),
            "[('a', '<f4', (2, 3)), ('b', [('', '<f4')])]"
        );
    }
}
