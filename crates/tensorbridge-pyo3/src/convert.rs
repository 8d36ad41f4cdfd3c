//! Python arguments -> core values: dtypes (names, NumPy/ml_dtypes/torch objects, buffer
//! formats), devices and stream integers.

use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple, PyType};
use tensorbridge_cai::{ImportOptions, TypeStr};
use tensorbridge_core::{DType, Device, Packing};

use crate::error::{Error, Result};

/// NumPy's and the struct module's one-character codes, for an LP64 platform (`l` is 64-bit,
/// as on Linux and macOS).
const CHAR_CODES: [(char, DType); 16] = [
    ('?', DType::BOOL),
    ('b', DType::INT8),
    ('B', DType::UINT8),
    ('h', DType::INT16),
    ('H', DType::UINT16),
    ('i', DType::INT32),
    ('I', DType::UINT32),
    ('l', DType::INT64),
    ('L', DType::UINT64),
    ('q', DType::INT64),
    ('Q', DType::UINT64),
    ('e', DType::FLOAT16),
    ('f', DType::FLOAT32),
    ('d', DType::FLOAT64),
    ('F', DType::COMPLEX64),
    ('D', DType::COMPLEX128),
];

fn char_code(c: char) -> Option<DType> {
    CHAR_CODES.iter().find(|(k, _)| *k == c).map(|(_, d)| *d)
}

/// A dtype name: the core's names and aliases, NumPy typestrs (`f4`, `<f4`) and one-character
/// codes (`d`). The bare `int` is refused as ambiguous.
pub(crate) fn dtype_from_name(name: &str) -> Result<DType> {
    if let Ok(dtype) = name.parse::<DType>() {
        return Ok(dtype);
    }
    if name == "int" {
        return Err(Error::AmbiguousDType {
            name: name.to_owned(),
            meanings: "torch.int is int32, NumPy's int is int64",
        });
    }
    let mut chars = name.chars();
    if let (Some(c), None) = (chars.next(), chars.next())
        && let Some(dtype) = char_code(c)
    {
        return Ok(dtype);
    }
    // A typestr, with the byte order NumPy lets you leave out.
    let typestr = if name.starts_with(['<', '>', '=', '|']) {
        name.to_owned()
    } else {
        format!("={name}")
    };
    match typestr.parse::<TypeStr>() {
        Ok(t) => t.to_dtype(&ImportOptions::new()).map_err(|e| match e {
            tensorbridge_cai::Error::NonNativeByteOrder { .. } => Error::NonNativeDType {
                name: name.to_owned(),
            },
            _ => tensorbridge_core::Error::UnknownDTypeName {
                name: name.to_owned(),
            }
            .into(),
        }),
        Err(_) => Err(tensorbridge_core::Error::UnknownDTypeName {
            name: name.to_owned(),
        }
        .into()),
    }
}

/// The module and name of an object's type, for messages and duck typing.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    let ty = obj.get_type();
    let name = ty
        .qualname()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_owned());
    match ty.module() {
        Ok(m) if m.to_cow().is_ok_and(|m| m != "builtins") => format!("{m}.{name}"),
        _ => name,
    }
}

/// A dtype argument: a name, a NumPy dtype or scalar type, an ml_dtypes type, a torch dtype,
/// or `float`/`int`/`bool`/`complex`. Sub-byte types from NumPy or ml_dtypes objects are
/// padded (one byte per element, as ml_dtypes stores them); from names they are packed
/// (DLPack's default).
pub(crate) fn dtype_from_py(obj: &Bound<'_, PyAny>) -> Result<(DType, Packing)> {
    let py = obj.py();
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok((dtype_from_name(&s.to_cow()?)?, Packing::Packed));
    }
    let unsupported = |name: String| -> Error { Error::UnsupportedDType { name } };
    if let Ok(ty) = obj.cast::<PyType>() {
        // Python's own types, with NumPy's meaning.
        let builtins = [
            (py.get_type::<pyo3::types::PyBool>(), DType::BOOL),
            (py.get_type::<pyo3::types::PyInt>(), DType::INT64),
            (py.get_type::<pyo3::types::PyFloat>(), DType::FLOAT64),
            (py.get_type::<pyo3::types::PyComplex>(), DType::COMPLEX128),
        ];
        if let Some((_, dtype)) = builtins.iter().find(|(t, _)| t.is(ty)) {
            return Ok((*dtype, Packing::Packed));
        }
        // NumPy scalar types (`np.float32`) and ml_dtypes types (`ml_dtypes.bfloat16`)
        // are named after their dtype.
        let module = ty.module().map(|m| m.to_string()).unwrap_or_default();
        if module.starts_with("numpy") || module.starts_with("ml_dtypes") {
            let name = ty.name()?.to_string();
            let dtype = name.parse::<DType>().map_err(|_| unsupported(name))?;
            return Ok((dtype, Packing::Padded));
        }
        return Err(Error::NotADType {
            type_name: format!("type {}", ty.qualname()?),
        });
    }
    let tname = type_name(obj);
    if tname == "torch.dtype" {
        // `str(torch.float32)` is "torch.float32".
        let s = obj.str()?.to_string();
        let name = s.strip_prefix("torch.").unwrap_or(&s);
        return name
            .parse::<DType>()
            .map(|d| (d, Packing::Packed))
            .map_err(|_| unsupported(s.clone()));
    }
    if tname.starts_with("numpy") {
        // A NumPy dtype (`np.dtype("f4")`, `np.dtype(ml_dtypes.bfloat16)`).
        let name = obj.getattr("name")?.str()?.to_string();
        let byteorder = obj.getattr("byteorder")?.str()?.to_string();
        let itemsize: usize = obj.getattr("itemsize")?.extract()?;
        let big = if cfg!(target_endian = "little") {
            ">"
        } else {
            "<"
        };
        if byteorder == big && itemsize > 1 {
            return Err(Error::NonNativeDType { name });
        }
        let dtype = name.parse::<DType>().map_err(|_| unsupported(name))?;
        return Ok((dtype, Packing::Padded));
    }
    Err(Error::NotADType { type_name: tname })
}

/// The dtype of a buffer-protocol format string (struct-module syntax), `None` meaning `B`.
pub(crate) fn dtype_from_format(format: Option<&str>) -> Result<DType> {
    let format = format.unwrap_or("B");
    let bad = || Error::BufferFormat {
        format: format.to_owned(),
    };
    let (order, code) = match format.chars().next() {
        Some(c @ ('@' | '=' | '<' | '>' | '!')) => (Some(c), &format[1..]),
        _ => (None, format),
    };
    let dtype = match code {
        "Zf" => DType::COMPLEX64,
        "Zd" => DType::COMPLEX128,
        _ => {
            let mut chars = code.chars();
            match (chars.next(), chars.next()) {
                (Some(c), None) => char_code(c).ok_or_else(bad)?,
                _ => return Err(bad()),
            }
        }
    };
    let foreign = if cfg!(target_endian = "little") {
        matches!(order, Some('>' | '!'))
    } else {
        order == Some('<')
    };
    if foreign && dtype.itemsize() > 1 {
        return Err(bad());
    }
    Ok(dtype)
}

/// A device argument: `"cpu"`, `"cuda"`, `"cuda:1"` (the core's names), a torch device, or a
/// DLPack `(device_type, device_id)` tuple.
pub(crate) fn device_from_py(obj: &Bound<'_, PyAny>) -> Result<Device> {
    if let Ok(s) = obj.cast::<PyString>() {
        return parse_device(&s.to_cow()?);
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        let (kind, id): (i32, i32) = t.extract().map_err(|_| Error::NotADevice {
            type_name: "tuple that is not (int, int)".to_owned(),
        })?;
        return Ok(Device::from_dlpack(kind, id)?);
    }
    let tname = type_name(obj);
    if tname == "torch.device" {
        return parse_device(&obj.str()?.to_string());
    }
    Err(Error::NotADevice { type_name: tname })
}

/// A device name; `"cuda"` (and `"gpu"`) without an ordinal is the calling thread's current
/// device, as in PyTorch (`torch.device("cuda")`) and CuPy, not `cuda:0`.
fn parse_device(name: &str) -> Result<Device> {
    let device = name.parse::<Device>()?;
    if device.kind == tensorbridge_core::DeviceType::Cuda && !name.contains(':') {
        return Ok(Device::cuda(current_cuda_ordinal()));
    }
    Ok(device)
}

/// The calling thread's current CUDA device (its current context's), 0 when none is current
/// or there is no driver (the runtime API's default).
pub(crate) fn current_cuda_ordinal() -> u32 {
    tensorbridge_cuda::current_device()
        .ok()
        .flatten()
        .unwrap_or(0)
}

/// A stream argument: `None` or an int (bools are not streams).
pub(crate) fn stream_from_py(obj: Option<&Bound<'_, PyAny>>) -> Result<Option<i64>> {
    let Some(obj) = obj else { return Ok(None) };
    if obj.is_none() {
        return Ok(None);
    }
    if obj.cast::<pyo3::types::PyBool>().is_err() {
        if let Ok(v) = obj.extract::<i64>() {
            return Ok(Some(v));
        }
        if obj.cast::<pyo3::types::PyInt>().is_ok() {
            return Err(Error::StreamRange {
                repr: obj.repr()?.to_string(),
            });
        }
    }
    Err(Error::StreamType {
        type_name: type_name(obj),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_every_convention() {
        let cases = [
            ("float32", DType::FLOAT32),
            ("float", DType::FLOAT32),
            ("bf16", DType::BFLOAT16),
            ("f4", DType::FLOAT32),
            ("<f8", DType::FLOAT64),
            ("|b1", DType::BOOL),
            ("?", DType::BOOL),
            ("d", DType::FLOAT64),
            ("l", DType::INT64),
            ("c16", DType::COMPLEX128),
            ("u1", DType::UINT8),
            (">u1", DType::UINT8),
        ];
        for (name, want) in cases {
            assert_eq!(dtype_from_name(name).unwrap(), want, "{name}");
        }
        assert!(matches!(
            dtype_from_name("int"),
            Err(Error::AmbiguousDType { .. })
        ));
        assert!(matches!(
            dtype_from_name(">f4"),
            Err(Error::NonNativeDType { .. })
        ));
        assert!(matches!(
            dtype_from_name("float33"),
            Err(Error::Core(
                tensorbridge_core::Error::UnknownDTypeName { .. }
            ))
        ));
    }

    #[test]
    fn buffer_formats() {
        assert_eq!(dtype_from_format(None).unwrap(), DType::UINT8);
        assert_eq!(dtype_from_format(Some("<d")).unwrap(), DType::FLOAT64);
        assert_eq!(dtype_from_format(Some("Zf")).unwrap(), DType::COMPLEX64);
        assert_eq!(dtype_from_format(Some(">b")).unwrap(), DType::INT8);
        assert!(dtype_from_format(Some(">i")).is_err());
        assert!(dtype_from_format(Some("T{i:x:}")).is_err());
        assert!(dtype_from_format(Some("2i")).is_err());
    }
}
