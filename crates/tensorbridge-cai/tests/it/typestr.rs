//! The typestr grammar and the dtype table.

use std::num::NonZeroU32;

use proptest::prelude::*;
use tensorbridge_cai::{
    ByteOrder, DateTimeUnit, Error, ImportOptions, TimeUnit, TypeKind, TypeStr,
};
use tensorbridge_core::{DType, DTypeCode};
use tensorbridge_testkit::dtype;

use crate::{config, plain, ts};

include!("numpy_typestrs.rs");

/// The dtypes the crate maps without hints, by NumPy name.
const PLAIN: [&str; 14] = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
];

#[cfg(target_endian = "little")]
#[test]
fn numpy_typestrs_match_reference() {
    for &(name, numpy, itemsize) in NUMPY_TYPESTRS {
        let parsed = ts(numpy);
        assert_eq!(parsed.to_string(), numpy, "{name} prints back unchanged");
        if PLAIN.contains(&name) {
            let dt: DType = name.parse().unwrap();
            assert_eq!(
                TypeStr::from_dtype(dt).unwrap().to_string(),
                numpy,
                "{name}"
            );
            assert_eq!(parsed.to_dtype(&plain()).unwrap(), dt, "{name}");
            assert_eq!(dt.itemsize() as u64, itemsize, "{name}");
        } else if parsed.kind == TypeKind::Void {
            // Plain void: opaque bytes, which export as NumPy prints them.
            let bits = u8::try_from(itemsize * 8).unwrap_or(0);
            match DType::new(DTypeCode::OpaqueHandle, bits, 1) {
                Ok(opaque) => {
                    assert_eq!(TypeStr::from_dtype(opaque).unwrap().to_string(), numpy);
                    let opts = ImportOptions::new().void_as(opaque);
                    assert_eq!(parsed.to_dtype(&opts).unwrap(), opaque);
                }
                Err(_) => assert!(matches!(
                    parsed.to_dtype(&plain()),
                    Err(Error::VoidNeedsDType { .. })
                )),
            }
        } else {
            assert!(
                matches!(
                    parsed.to_dtype(&plain()),
                    Err(Error::UnsupportedTypeStr { typestr }) if typestr == parsed
                ),
                "{name} ({numpy}) has no core dtype"
            );
        }
    }
}

#[cfg(target_endian = "little")]
#[test]
fn ml_dtypes_typestrs_match_reference() {
    for &(name, ml, itemsize) in ML_DTYPES_TYPESTRS {
        let dt: DType = name.parse().unwrap();
        let parsed = ts(ml);
        assert_eq!(parsed.to_string(), ml);
        let with_hint = parsed.to_dtype(&ImportOptions::new().void_as(dt));
        if dt == DType::BFLOAT16 {
            // The one convention: ml_dtypes, CuPy and PyTorch all say `<V2`.
            assert_eq!(TypeStr::from_dtype(dt).unwrap().to_string(), ml);
        } else {
            // No convention for fp8/fp6/fp4: export refuses.
            assert_eq!(
                TypeStr::from_dtype(dt),
                Err(Error::NoTypeStr { dtype: dt }),
                "{name}"
            );
        }
        if parsed.kind == TypeKind::Void {
            // Import works when the caller names the dtype, and only then.
            assert_eq!(with_hint.unwrap(), dt, "{name}");
            assert_eq!(
                parsed.to_dtype(&plain()),
                Err(Error::VoidNeedsDType { typestr: parsed })
            );
            assert_eq!(
                dt.storage_bits(tensorbridge_core::Packing::Padded) / 8,
                itemsize
            );
        } else {
            // float8_e5m2 is `<f1`, which nothing else produces or takes.
            assert_eq!(name, "float8_e5m2");
            assert_eq!(
                parsed.to_dtype(&plain()),
                Err(Error::UnsupportedTypeStr { typestr: parsed })
            );
        }
    }
}

#[test]
fn every_kind_and_byte_order_of_the_grammar_parses_and_prints() {
    let cases = [
        ("|t8", ByteOrder::NotApplicable, TypeKind::Bitfield, Some(8)),
        ("|b1", ByteOrder::NotApplicable, TypeKind::Bool, Some(1)),
        ("<i4", ByteOrder::Little, TypeKind::Int, Some(4)),
        (">u2", ByteOrder::Big, TypeKind::UInt, Some(2)),
        ("=f8", ByteOrder::Native, TypeKind::Float, Some(8)),
        ("<c16", ByteOrder::Little, TypeKind::Complex, Some(16)),
        ("<m8", ByteOrder::Little, TypeKind::Timedelta(None), Some(8)),
        ("|O", ByteOrder::NotApplicable, TypeKind::Object, None),
        ("|S5", ByteOrder::NotApplicable, TypeKind::Bytes, Some(5)),
        ("<U3", ByteOrder::Little, TypeKind::Unicode, Some(3)),
        ("|V16", ByteOrder::NotApplicable, TypeKind::Void, Some(16)),
    ];
    for (s, byte_order, kind, size) in cases {
        let t = ts(s);
        assert_eq!(
            t,
            TypeStr {
                byte_order,
                kind,
                size
            },
            "{s}"
        );
        assert_eq!(t.to_string(), s);
    }
    let ns = ts(">M8[10ns]");
    assert_eq!(
        ns.kind,
        TypeKind::Datetime(Some(DateTimeUnit {
            count: NonZeroU32::new(10).unwrap(),
            unit: TimeUnit::Nanoseconds
        }))
    );
    assert_eq!(ns.to_string(), ">M8[10ns]");
    // Accepted, printed canonically.
    assert_eq!(ts("<M8[1D]").to_string(), "<M8[D]");
    assert_eq!(ts("<f004").to_string(), "<f4");
}

#[test]
fn one_byte_scalars_accept_any_byte_order() {
    for s in [">i1", "<u1", "=b1", ">b1", "|i1"] {
        assert!(ts(s).to_dtype(&plain()).is_ok(), "{s}");
    }
    // Complex halves are 4 bytes: the order matters.
    assert!(ts(">c8").to_dtype(&plain()).is_err());
    // Opaque bytes have no order.
    let opaque = DType::new(DTypeCode::OpaqueHandle, 16, 1).unwrap();
    let opts = ImportOptions::new().void_as(opaque);
    assert_eq!(ts(">V2").to_dtype(&opts), Ok(opaque));
    // bfloat16 behind `>V2` is big-endian bfloat16.
    let opts = ImportOptions::new().void_as(DType::BFLOAT16);
    assert!(matches!(
        ts(">V2").to_dtype(&opts),
        Err(Error::NonNativeByteOrder { .. })
    ));
}

#[test]
fn native_and_not_applicable_orders_read_as_native() {
    for s in ["=f4", "|f4", "<f4"] {
        assert_eq!(ts(s).to_dtype(&plain()), Ok(DType::FLOAT32), "{s}");
    }
}

#[test]
fn void_as_reads_sub_byte_types_one_byte_each() {
    let opts = ImportOptions::new().void_as(DType::FLOAT4_E2M1FN);
    assert_eq!(ts("<V1").to_dtype(&opts), Ok(DType::FLOAT4_E2M1FN));
    // The hint applies only to raw bytes.
    assert_eq!(ts("<f4").to_dtype(&opts), Ok(DType::FLOAT32));
}

fn time_unit() -> impl Strategy<Value = DateTimeUnit> {
    let units = vec![
        TimeUnit::Years,
        TimeUnit::Months,
        TimeUnit::Weeks,
        TimeUnit::Days,
        TimeUnit::Hours,
        TimeUnit::Minutes,
        TimeUnit::Seconds,
        TimeUnit::Milliseconds,
        TimeUnit::Microseconds,
        TimeUnit::Nanoseconds,
        TimeUnit::Picoseconds,
        TimeUnit::Femtoseconds,
        TimeUnit::Attoseconds,
    ];
    (1u32..=u32::MAX, proptest::sample::select(units)).prop_map(|(count, unit)| DateTimeUnit {
        count: NonZeroU32::new(count).expect("count >= 1"),
        unit,
    })
}

/// Every typestr value: all byte orders, all kinds, units, sizes or none.
fn any_typestr() -> impl Strategy<Value = TypeStr> {
    let order = proptest::sample::select(vec![
        ByteOrder::Little,
        ByteOrder::Big,
        ByteOrder::Native,
        ByteOrder::NotApplicable,
    ]);
    let kind = prop_oneof![
        proptest::sample::select(vec![
            TypeKind::Bitfield,
            TypeKind::Bool,
            TypeKind::Int,
            TypeKind::UInt,
            TypeKind::Float,
            TypeKind::Complex,
            TypeKind::Object,
            TypeKind::Bytes,
            TypeKind::Unicode,
            TypeKind::Void,
        ]),
        proptest::option::of(time_unit()).prop_map(TypeKind::Timedelta),
        proptest::option::of(time_unit()).prop_map(TypeKind::Datetime),
    ];
    let size = proptest::option::of(prop_oneof![0u64..=32, any::<u64>()]);
    (order, kind, size).prop_map(|(byte_order, kind, size)| TypeStr {
        byte_order,
        kind,
        size,
    })
}

/// Any string of up to 12 characters from all of Unicode. (Combinators rather than a regex:
/// compiling `.` into a Unicode class takes minutes under Miri.)
fn any_string() -> impl Strategy<Value = String> {
    proptest::collection::vec(any::<char>(), 0..=12).prop_map(String::from_iter)
}

/// Strings close to the grammar: an optional byte order and kind (or a wrong character),
/// up to 24 digits, an optional bracket with a count and a unit (or a wrong one), maybe
/// unclosed, and maybe a trailing letter.
fn near_miss() -> impl Strategy<Value = String> {
    let one_of = |chars: &'static str| {
        proptest::option::of(proptest::sample::select(chars.chars().collect::<Vec<_>>()))
            .prop_map(|c| c.map(String::from).unwrap_or_default())
    };
    let digits = |max: usize| {
        proptest::collection::vec(proptest::char::range('0', '9'), 0..=max)
            .prop_map(String::from_iter)
    };
    let unit = proptest::option::of((
        digits(12),
        proptest::sample::select(vec!["ns", "us", "D", "Y", "xs", ""]),
        any::<bool>(),
    ))
    .prop_map(|u| match u {
        Some((count, abbrev, closed)) => {
            format!("[{count}{abbrev}{}", if closed { "]" } else { "" })
        }
        None => String::new(),
    });
    (
        one_of("<>=|!"),
        one_of("tbiufcmMOSUVx"),
        digits(24),
        unit,
        one_of("az"),
    )
        .prop_map(|(order, kind, size, unit, tail)| format!("{order}{kind}{size}{unit}{tail}"))
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn typestr_display_parse_roundtrip(t in any_typestr()) {
        let s = t.to_string();
        prop_assert_eq!(s.parse::<TypeStr>(), Ok(t));
    }

    #[test]
    fn dtype_typestr_roundtrip(dt in dtype()) {
        match TypeStr::from_dtype(dt) {
            Ok(t) => {
                let parsed: TypeStr = t.to_string().parse().unwrap();
                let opts = ImportOptions::new().void_as(dt);
                prop_assert_eq!(parsed.to_dtype(&opts), Ok(dt));
            }
            Err(e) => prop_assert_eq!(e, Error::NoTypeStr { dtype: dt }),
        }
    }

    #[test]
    fn typestr_parse_never_panics(s in any_string()) {
        if let Ok(t) = s.parse::<TypeStr>() {
            // Whatever parses prints as something that parses to the same value.
            prop_assert_eq!(t.to_string().parse::<TypeStr>(), Ok(t));
        }
    }

    #[test]
    fn near_miss_typestr_parse_never_panics(s in near_miss()) {
        match s.parse::<TypeStr>() {
            Ok(t) => {
                let opts = ImportOptions::new().void_as(DType::BFLOAT16);
                let _ = t.to_dtype(&opts);
                prop_assert_eq!(t.to_string().parse::<TypeStr>(), Ok(t));
            }
            Err(e) => prop_assert!(
                matches!(e, Error::MalformedTypeStr { ref typestr, .. } if *typestr == s),
                "{e:?}"
            ),
        }
    }
}
