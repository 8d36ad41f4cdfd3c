//! `__cuda_array_interface__` and `__array_interface__`: the dicts read into the CAI adapter's
//! plain values (everything read here is untrusted: the adapter validates it), and the
//! imports through them.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use tensorbridge_cai::{
    ArrayData, ArrayInterface, BufferRegion, CudaArrayInterface, DataPointer, DescrField,
    DescrFormat, ImportOptions, TypeKind, TypeStr,
};
use tensorbridge_core::{DType, Device};

use crate::convert::{dtype_from_py, type_name};
use crate::error::{Error, Result};
use crate::floor::access::Provenance;
use crate::import::{Consumer, Imported, Pin, buffer, order_consumer};

/// Which dict a message is about.
#[derive(Clone, Copy)]
pub(crate) enum Which {
    Cuda,
    Array,
}

impl Which {
    fn name(self) -> &'static str {
        match self {
            Which::Cuda => "__cuda_array_interface__",
            Which::Array => "__array_interface__",
        }
    }
}

fn bad(which: Which, key: &'static str, expected: &'static str, found: String) -> Error {
    Error::InterfaceKey {
        interface: which.name(),
        key,
        expected,
        found,
    }
}

fn describe(obj: &Bound<'_, PyAny>) -> String {
    match obj.repr() {
        Ok(r) => {
            let r = r.to_string();
            if r.len() > 80 {
                format!("a {}", type_name(obj))
            } else {
                r
            }
        }
        Err(_) => format!("a {}", type_name(obj)),
    }
}

/// The interface dict itself.
pub(crate) fn as_dict<'py>(which: Which, obj: &Bound<'py, PyAny>) -> Result<Bound<'py, PyDict>> {
    obj.cast::<PyDict>()
        .cloned()
        .map_err(|_| Error::InterfaceNotDict {
            interface: which.name(),
            found: type_name(obj),
        })
}

fn get<'py>(dict: &Bound<'py, PyDict>, key: &str) -> Result<Option<Bound<'py, PyAny>>> {
    Ok(dict.get_item(key)?.filter(|v| !v.is_none()))
}

fn required<'py>(
    which: Which,
    dict: &Bound<'py, PyDict>,
    key: &'static str,
    expected: &'static str,
) -> Result<Bound<'py, PyAny>> {
    get(dict, key)?.ok_or_else(|| Error::MissingKey {
        interface: which.name(),
        key,
        expected,
    })
}

fn ints(which: Which, key: &'static str, obj: &Bound<'_, PyAny>) -> Result<Vec<i64>> {
    let expected = "a tuple of ints";
    let tuple = obj
        .cast::<PyTuple>()
        .map_err(|_| bad(which, key, expected, describe(obj)))?;
    tuple
        .iter()
        .map(|v| {
            v.extract::<i64>()
                .map_err(|_| bad(which, key, expected, describe(obj)))
        })
        .collect()
}

fn typestr(which: Which, dict: &Bound<'_, PyDict>) -> Result<TypeStr> {
    let obj = required(which, dict, "typestr", "a typestr like '<f4'")?;
    let s = obj
        .cast::<PyString>()
        .map_err(|_| bad(which, "typestr", "a str like '<f4'", describe(&obj)))?;
    Ok(s.to_cow()?.parse::<TypeStr>()?)
}

fn pointer(which: Which, obj: &Bound<'_, PyAny>) -> Result<DataPointer> {
    let (address, readonly): (usize, bool) = obj
        .extract()
        .map_err(|_| bad(which, "data", "an (int, bool) tuple", describe(obj)))?;
    Ok(DataPointer { address, readonly })
}

/// A `descr` list, read flat: `[(name, typestr)]` or `[(name, typestr, shape)]` entries.
/// Only the default one-field form `[('', typestr)]` is ever accepted (the CAI adapter checks
/// that), so a nested field (a format that is itself a list: a structured dtype) is refused
/// here, without reading into it: a cyclic or deeply nested list from a producer is never
/// walked (\[refuse\]).
fn descr(which: Which, obj: &Bound<'_, PyAny>) -> Result<Vec<DescrField>> {
    let expected =
        "a list of (name, typestr[, shape]) tuples (structured dtypes are not supported)";
    let list = obj
        .cast::<PyList>()
        .map_err(|_| bad(which, "descr", expected, describe(obj)))?;
    // One field is all the only accepted form has; a longer list is refused without being
    // read (its entries may be anything, itself included).
    if list.len() > 1 {
        return Err(bad(
            which,
            "descr",
            expected,
            format!("a list of {} fields", list.len()),
        ));
    }
    list.iter()
        .map(|item| {
            let t = item
                .cast::<PyTuple>()
                .map_err(|_| bad(which, "descr", expected, describe(&item)))?;
            if !(2..=3).contains(&t.len()) {
                return Err(bad(which, "descr", expected, describe(&item)));
            }
            // A NumPy `(title, name)` pair is given by its name.
            let name_obj = t.get_item(0)?;
            let name = match name_obj.cast::<PyTuple>() {
                Ok(pair) if pair.len() == 2 => pair.get_item(1)?.str()?.to_string(),
                _ => name_obj.str()?.to_string(),
            };
            let format_obj = t.get_item(1)?;
            let format = match format_obj.cast::<PyString>() {
                Ok(s) => DescrFormat::TypeStr(s.to_cow()?.parse::<TypeStr>()?),
                Err(_) => {
                    return Err(bad(
                        which,
                        "descr",
                        expected,
                        format!("a field whose format is a {}", type_name(&format_obj)),
                    ));
                }
            };
            let shape = if t.len() == 3 {
                Some(ints(which, "descr", &t.get_item(2)?)?)
            } else {
                None
            };
            Ok(DescrField {
                name,
                format,
                shape,
            })
        })
        .collect()
}

fn version(which: Which, dict: &Bound<'_, PyDict>) -> Result<i64> {
    match get(dict, "version")? {
        // Version 0 producers may leave it out.
        None => Ok(0),
        Some(v) => v
            .extract::<i64>()
            .map_err(|_| bad(which, "version", "an int", describe(&v))),
    }
}

/// Reads a `__cuda_array_interface__` dict.
pub(crate) fn read_cai(dict: &Bound<'_, PyDict>) -> Result<CudaArrayInterface> {
    let which = Which::Cuda;
    let stream = match get(dict, "stream")? {
        None => None,
        Some(v) => Some(
            v.extract::<i64>()
                .map_err(|_| bad(which, "stream", "None or an int", describe(&v)))?,
        ),
    };
    Ok(CudaArrayInterface {
        shape: ints(
            which,
            "shape",
            &required(which, dict, "shape", "a tuple of ints")?,
        )?,
        typestr: typestr(which, dict)?,
        data: pointer(
            which,
            &required(which, dict, "data", "an (int, bool) tuple")?,
        )?,
        strides: get(dict, "strides")?
            .map(|s| ints(which, "strides", &s))
            .transpose()?,
        descr: get(dict, "descr")?.map(|d| descr(which, &d)).transpose()?,
        mask: get(dict, "mask")?.is_some(),
        version: version(which, dict)?,
        stream,
    })
}

/// What `data` of an `__array_interface__` names, before the buffer form is resolved.
pub(crate) enum ArrayDataSource<'py> {
    Pointer(DataPointer),
    /// The buffer of this object (the dict's owner when `data` is `None` or absent).
    Buffer(Option<Bound<'py, PyAny>>),
}

/// Reads an `__array_interface__` dict; the buffer form comes back unresolved, with an
/// empty region the caller replaces.
pub(crate) fn read_array<'py>(
    dict: &Bound<'py, PyDict>,
) -> Result<(ArrayInterface, ArrayDataSource<'py>)> {
    let which = Which::Array;
    let source = match get(dict, "data")? {
        None => ArrayDataSource::Buffer(None),
        Some(d) if d.cast::<PyTuple>().is_ok() => ArrayDataSource::Pointer(pointer(which, &d)?),
        Some(d) => ArrayDataSource::Buffer(Some(d)),
    };
    let data = match &source {
        ArrayDataSource::Pointer(p) => ArrayData::Pointer(*p),
        ArrayDataSource::Buffer(_) => ArrayData::Buffer(tensorbridge_cai::BufferRegion {
            address: 0,
            len: 0,
            readonly: true,
        }),
    };
    let offset = match get(dict, "offset")? {
        None => 0,
        Some(v) => v
            .extract::<i64>()
            .map_err(|_| bad(which, "offset", "an int", describe(&v)))?,
    };
    let ai = ArrayInterface {
        shape: ints(
            which,
            "shape",
            &required(which, dict, "shape", "a tuple of ints")?,
        )?,
        typestr: typestr(which, dict)?,
        data,
        strides: get(dict, "strides")?
            .map(|s| ints(which, "strides", &s))
            .transpose()?,
        descr: get(dict, "descr")?.map(|d| descr(which, &d)).transpose()?,
        mask: get(dict, "mask")?.is_some(),
        offset,
        version: version(which, dict)?,
    };
    Ok((ai, source))
}

/// ml_dtypes gives `float8_e5m2` the typestr `<f1` (kind `f`, one byte) where its other
/// 8-bit types say `<V1`: when the object's own `dtype` names a one-byte dtype the core knows,
/// read `f1` as raw bytes of that dtype, as for `V1` (`descr` repeated the typestr; it goes
/// too). NumPy itself has no one-byte float.
fn one_byte_float(
    obj: &Bound<'_, PyAny>,
    typestr: &mut TypeStr,
    descr: &mut Option<Vec<DescrField>>,
) {
    if typestr.kind != TypeKind::Float || typestr.size != Some(1) {
        return;
    }
    let named = obj
        .getattr("dtype")
        .ok()
        .and_then(|d| dtype_from_py(&d).ok())
        .is_some_and(|(d, _)| d.itemsize() == 1 && d.code() != tensorbridge_core::DTypeCode::Float);
    if named {
        *typestr = TypeStr::new(
            tensorbridge_cai::ByteOrder::NotApplicable,
            TypeKind::Void,
            1,
        );
        *descr = None;
    }
}

/// What `V` (raw bytes) typestrs mean: the object's own `dtype` attribute when it names a
/// dtype of that size (a CuPy or NumPy array of an ml_dtypes type), else bfloat16 for `V2`
/// (the one convention; see tensorbridge-cai).
fn void_options(obj: &Bound<'_, PyAny>, typestr: TypeStr) -> ImportOptions {
    if typestr.kind != TypeKind::Void {
        return ImportOptions::new();
    }
    let size = typestr.size.unwrap_or(0);
    let named = obj
        .getattr("dtype")
        .ok()
        .and_then(|d| dtype_from_py(&d).ok())
        .map(|(d, _)| d)
        .filter(|d| d.storage_bits(tensorbridge_core::Packing::Padded) / 8 == size);
    match (named, size) {
        (Some(d), _) => ImportOptions::new().void_as(d),
        (None, 2) => ImportOptions::new().void_as(DType::BFLOAT16),
        _ => ImportOptions::new(),
    }
}

/// `__cuda_array_interface__`: the device comes from the driver, which also checks that the
/// span lies inside one allocation (\[span\]); without a driver a pointer cannot be checked
/// and is refused (only a null pointer, for zero-size arrays, is taken, on `cuda:0`). The
/// exporter is the pin: the interface fixes its memory, and its `stream`, for its life.
pub(crate) fn from_cai(
    obj: &Bound<'_, PyAny>,
    cai: &Bound<'_, PyAny>,
    consumer: Consumer,
) -> Result<Imported> {
    let mut cai = read_cai(&as_dict(Which::Cuda, cai)?)?;
    one_byte_float(obj, &mut cai.typestr, &mut cai.descr);
    let options = void_options(obj, cai.typestr);
    let checked = cai.data.address != 0;
    if checked && !tensorbridge_cuda::driver_present() {
        return Err(Error::Unchecked {
            addr: cai.data.address,
            device: Device::cuda(0),
        });
    }
    let device = if checked {
        tensorbridge_cuda::inspect(cai.data.address)?.device()
    } else {
        Device::cuda(0)
    };
    let validated = cai.import(device, &options)?;
    if checked {
        tensorbridge_cuda::check_span(validated.descriptor())?;
    }
    let ready = validated.ready();
    let (desc, _) = validated.into_parts();
    // \[ready\]: the exported stream lives as long as the exporting object (CAI v3), which
    // the pin is; it is where the exporter's pending work is.
    order_consumer(&desc, &ready, consumer)?;
    Ok(Imported {
        desc,
        ready,
        pin: Pin::Caller,
        current: None,
        provenance: Provenance::Flagged,
    })
}

/// `__array_interface__`: host memory, as a pointer (the exporter is the pin) or as a buffer
/// the dict names (the held buffer is the pin). A buffer is asked for C-contiguously
/// (`PyBUF_SIMPLE`, as NumPy asks for it), so its `buf` and `len` are exactly the memory it
/// exports and the import checks the span against that (\[span\]); a strided buffer (a
/// `memoryview` with steps) is refused by its exporter.
pub(crate) fn from_array_interface(
    obj: &Bound<'_, PyAny>,
    ai: &Bound<'_, PyAny>,
) -> Result<Imported> {
    let (mut ai, source) = read_array(&as_dict(Which::Array, ai)?)?;
    let held = match source {
        ArrayDataSource::Pointer(_) => None,
        ArrayDataSource::Buffer(target) => {
            let target = target.unwrap_or_else(|| obj.clone());
            let held = buffer::hold_contiguous(&target)?.ok_or_else(|| Error::InterfaceKey {
                interface: "__array_interface__",
                key: "data",
                expected: "an (int, bool) tuple, or an object with a buffer",
                found: format!("a {} without a buffer", type_name(&target)),
            })?;
            let view = held.view();
            ai.data = ArrayData::Buffer(BufferRegion {
                address: view.buf.expose_provenance(),
                len: usize::try_from(view.len).unwrap_or(0),
                readonly: view.readonly != 0,
            });
            Some(held)
        }
    };
    one_byte_float(obj, &mut ai.typestr, &mut ai.descr);
    let options = void_options(obj, ai.typestr);
    let (desc, _) = ai.import(&options)?.into_parts();
    Ok(Imported {
        desc,
        // The array interface has no stream: nothing is pending.
        ready: tensorbridge_core::Ready::Now,
        pin: match held {
            Some(held) => Pin::Owner(held),
            None => Pin::Caller,
        },
        current: None,
        provenance: Provenance::Flagged,
    })
}
