//! Element types: every DLPack type code, with its bit width and lanes.

use std::fmt;
use std::str::FromStr;

use crate::Error;

/// The kind of an element, one variant per DLPack `DLDataTypeCode` (DLPack 1.3).
///
/// The raw `u8` codes of foreign descriptors enter through [`DTypeCode::from_code`], which
/// refuses codes this version does not know, with the code in the error.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DTypeCode {
    /// `kDLInt` (0): two's complement signed integer.
    Int,
    /// `kDLUInt` (1): unsigned integer.
    UInt,
    /// `kDLFloat` (2): IEEE 754 binary float.
    Float,
    /// `kDLOpaqueHandle` (3): bytes whose meaning the two parties agree on.
    OpaqueHandle,
    /// `kDLBfloat` (4): bfloat16.
    Bfloat,
    /// `kDLComplex` (5): `(re, im)` pair; `bits` counts both halves.
    Complex,
    /// `kDLBool` (6): one byte per value.
    Bool,
    /// `kDLFloat8_e3m4` (7).
    Float8E3M4,
    /// `kDLFloat8_e4m3` (8).
    Float8E4M3,
    /// `kDLFloat8_e4m3b11fnuz` (9).
    Float8E4M3B11Fnuz,
    /// `kDLFloat8_e4m3fn` (10).
    Float8E4M3Fn,
    /// `kDLFloat8_e4m3fnuz` (11).
    Float8E4M3Fnuz,
    /// `kDLFloat8_e5m2` (12).
    Float8E5M2,
    /// `kDLFloat8_e5m2fnuz` (13).
    Float8E5M2Fnuz,
    /// `kDLFloat8_e8m0fnu` (14): the MX scale format.
    Float8E8M0Fnu,
    /// `kDLFloat6_e2m3fn` (15): 6 bits, packed unless flagged padded.
    Float6E2M3Fn,
    /// `kDLFloat6_e3m2fn` (16): 6 bits, packed unless flagged padded.
    Float6E3M2Fn,
    /// `kDLFloat4_e2m1fn` (17): 4 bits, packed unless flagged padded.
    Float4E2M1Fn,
}

/// One row per code: the code, the variant, the name stem users type, and the bit widths
/// DLPack allows for it. The single source of truth for codes, names and bit rules.
static CODES: [(u8, DTypeCode, &str, &[u8]); 18] = [
    (0, DTypeCode::Int, "int", &[8, 16, 32, 64]),
    (1, DTypeCode::UInt, "uint", &[8, 16, 32, 64]),
    (2, DTypeCode::Float, "float", &[16, 32, 64]),
    (3, DTypeCode::OpaqueHandle, "opaque", &[8, 16, 32, 64, 128]),
    (4, DTypeCode::Bfloat, "bfloat", &[16]),
    (5, DTypeCode::Complex, "complex", &[32, 64, 128]),
    (6, DTypeCode::Bool, "bool", &[8]),
    (7, DTypeCode::Float8E3M4, "float8_e3m4", &[8]),
    (8, DTypeCode::Float8E4M3, "float8_e4m3", &[8]),
    (9, DTypeCode::Float8E4M3B11Fnuz, "float8_e4m3b11fnuz", &[8]),
    (10, DTypeCode::Float8E4M3Fn, "float8_e4m3fn", &[8]),
    (11, DTypeCode::Float8E4M3Fnuz, "float8_e4m3fnuz", &[8]),
    (12, DTypeCode::Float8E5M2, "float8_e5m2", &[8]),
    (13, DTypeCode::Float8E5M2Fnuz, "float8_e5m2fnuz", &[8]),
    (14, DTypeCode::Float8E8M0Fnu, "float8_e8m0fnu", &[8]),
    (15, DTypeCode::Float6E2M3Fn, "float6_e2m3fn", &[6]),
    (16, DTypeCode::Float6E3M2Fn, "float6_e3m2fn", &[6]),
    (17, DTypeCode::Float4E2M1Fn, "float4_e2m1fn", &[4]),
];

/// The known codes as ranges, for messages: `"0 to 17"`, read off [`CODES`].
pub(crate) fn known_codes() -> String {
    ranges(CODES.iter().map(|&(c, ..)| i64::from(c)))
}

/// Sorted integers as their runs: `[1, 2, 3, 4, 7, 8]` -> `"1 to 4 or 7 to 8"`.
pub(crate) fn ranges(sorted: impl IntoIterator<Item = i64>) -> String {
    let mut runs: Vec<(i64, i64)> = Vec::new();
    for v in sorted {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == v => *end = v,
            _ => runs.push((v, v)),
        }
    }
    runs.iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a} to {b}")
            }
        })
        .collect::<Vec<_>>()
        .join(" or ")
}

impl DTypeCode {
    /// The variant for a raw DLPack code, or [`Error::UnknownDTypeCode`].
    #[inline]
    pub fn from_code(code: u8) -> Result<Self, Error> {
        CODES
            .get(usize::from(code))
            .map(|row| row.1)
            .ok_or(Error::UnknownDTypeCode { code })
    }

    /// The raw DLPack code.
    #[inline]
    pub const fn code(self) -> u8 {
        self as u8
    }

    #[inline]
    fn row(self) -> &'static (u8, DTypeCode, &'static str, &'static [u8]) {
        &CODES[usize::from(self.code())]
    }

    /// The bit widths DLPack allows for one lane of this kind.
    #[inline]
    pub fn allowed_bits(self) -> &'static [u8] {
        self.row().3
    }

    /// Whether the name carries the bit width (`int32`) or is complete on its own
    /// (`bool`, `float8_e4m3fn`).
    fn name_has_bits(self) -> bool {
        self.allowed_bits().len() > 1 || matches!(self, DTypeCode::Bfloat)
    }
}

impl fmt::Display for DTypeCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.row().2)
    }
}

/// How sub-byte elements (fp6, fp4) are laid out in memory.
///
/// DLPack packs them by default (element `i` of a word `D` is `(D >> (i * bits)) & mask`) and
/// sets `DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED` when each element has its own bytes.
/// Irrelevant, and always [`Packing::Packed`], for types of whole bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Packing {
    /// Elements follow each other bit by bit (the DLPack default).
    #[default]
    Packed,
    /// Each element is padded to whole bytes.
    Padded,
}

/// A validated element type: code, bits per lane and lanes, as in DLPack's `DLDataType`.
///
/// Only [`DType::new`] and [`str::parse`] build one, and both enforce the rules of the
/// DLPack 1.3 header: bool is 8 bits, fp8 codes 8 bits, fp6 6 bits, fp4 4 bits, bfloat16 16,
/// ints and uints 8/16/32/64, floats 16/32/64, complex 32/64/128 (both halves), and lanes >= 1.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DType {
    code: DTypeCode,
    bits: u8,
    lanes: u16,
}

impl DType {
    /// `int8`.
    pub const INT8: DType = DType::scalar(DTypeCode::Int, 8);
    /// `int16`.
    pub const INT16: DType = DType::scalar(DTypeCode::Int, 16);
    /// `int32`.
    pub const INT32: DType = DType::scalar(DTypeCode::Int, 32);
    /// `int64`.
    pub const INT64: DType = DType::scalar(DTypeCode::Int, 64);
    /// `uint8`.
    pub const UINT8: DType = DType::scalar(DTypeCode::UInt, 8);
    /// `uint16`.
    pub const UINT16: DType = DType::scalar(DTypeCode::UInt, 16);
    /// `uint32`.
    pub const UINT32: DType = DType::scalar(DTypeCode::UInt, 32);
    /// `uint64`.
    pub const UINT64: DType = DType::scalar(DTypeCode::UInt, 64);
    /// `float16`.
    pub const FLOAT16: DType = DType::scalar(DTypeCode::Float, 16);
    /// `float32`.
    pub const FLOAT32: DType = DType::scalar(DTypeCode::Float, 32);
    /// `float64`.
    pub const FLOAT64: DType = DType::scalar(DTypeCode::Float, 64);
    /// `bfloat16`.
    pub const BFLOAT16: DType = DType::scalar(DTypeCode::Bfloat, 16);
    /// `complex32` (two float16 halves).
    pub const COMPLEX32: DType = DType::scalar(DTypeCode::Complex, 32);
    /// `complex64` (two float32 halves).
    pub const COMPLEX64: DType = DType::scalar(DTypeCode::Complex, 64);
    /// `complex128` (two float64 halves).
    pub const COMPLEX128: DType = DType::scalar(DTypeCode::Complex, 128);
    /// `bool`, one byte per value.
    pub const BOOL: DType = DType::scalar(DTypeCode::Bool, 8);
    /// `float8_e3m4`.
    pub const FLOAT8_E3M4: DType = DType::scalar(DTypeCode::Float8E3M4, 8);
    /// `float8_e4m3`.
    pub const FLOAT8_E4M3: DType = DType::scalar(DTypeCode::Float8E4M3, 8);
    /// `float8_e4m3b11fnuz`.
    pub const FLOAT8_E4M3B11FNUZ: DType = DType::scalar(DTypeCode::Float8E4M3B11Fnuz, 8);
    /// `float8_e4m3fn`.
    pub const FLOAT8_E4M3FN: DType = DType::scalar(DTypeCode::Float8E4M3Fn, 8);
    /// `float8_e4m3fnuz`.
    pub const FLOAT8_E4M3FNUZ: DType = DType::scalar(DTypeCode::Float8E4M3Fnuz, 8);
    /// `float8_e5m2`.
    pub const FLOAT8_E5M2: DType = DType::scalar(DTypeCode::Float8E5M2, 8);
    /// `float8_e5m2fnuz`.
    pub const FLOAT8_E5M2FNUZ: DType = DType::scalar(DTypeCode::Float8E5M2Fnuz, 8);
    /// `float8_e8m0fnu`.
    pub const FLOAT8_E8M0FNU: DType = DType::scalar(DTypeCode::Float8E8M0Fnu, 8);
    /// `float6_e2m3fn`.
    pub const FLOAT6_E2M3FN: DType = DType::scalar(DTypeCode::Float6E2M3Fn, 6);
    /// `float6_e3m2fn`.
    pub const FLOAT6_E3M2FN: DType = DType::scalar(DTypeCode::Float6E3M2Fn, 6);
    /// `float4_e2m1fn`.
    pub const FLOAT4_E2M1FN: DType = DType::scalar(DTypeCode::Float4E2M1Fn, 4);
    /// `float4_e2m1fnx2`: two fp4 values per byte (libtorch's `Float4_e2m1fn_x2`).
    pub const FLOAT4_E2M1FNX2: DType = DType {
        code: DTypeCode::Float4E2M1Fn,
        bits: 4,
        lanes: 2,
    };

    const fn scalar(code: DTypeCode, bits: u8) -> DType {
        DType {
            code,
            bits,
            lanes: 1,
        }
    }

    /// A dtype from its parts, checked against the rules of its code.
    #[inline]
    pub fn new(code: DTypeCode, bits: u8, lanes: u16) -> Result<Self, Error> {
        // A scan, not `contains`: on `[u8]` that is a `memchr` call, dearer than the few
        // comparisons of these short lists (measured: docs/BENCHMARKS.md, "Conversions at
        // the metadata floor").
        #[allow(
            clippy::manual_contains,
            reason = "`contains` on `[u8]` calls `memchr`: a library call per validation"
        )]
        if !code.allowed_bits().iter().any(|&b| b == bits) {
            return Err(Error::InvalidBits {
                code,
                bits,
                allowed: code.allowed_bits(),
            });
        }
        if lanes == 0 {
            return Err(Error::ZeroLanes { code });
        }
        Ok(DType { code, bits, lanes })
    }

    /// A dtype from the raw fields of a DLPack `DLDataType`.
    #[inline]
    pub fn from_dlpack(code: u8, bits: u8, lanes: u16) -> Result<Self, Error> {
        DType::new(DTypeCode::from_code(code)?, bits, lanes)
    }

    /// The kind of element.
    #[inline]
    pub const fn code(self) -> DTypeCode {
        self.code
    }

    /// Bits of one lane (DLPack's `bits`).
    #[inline]
    pub const fn bits(self) -> u8 {
        self.bits
    }

    /// Lanes per element; 1 for scalars (DLPack's `lanes`).
    #[inline]
    pub const fn lanes(self) -> u16 {
        self.lanes
    }

    /// Bits of one element: `bits * lanes`.
    pub const fn element_bits(self) -> u32 {
        self.bits as u32 * self.lanes as u32
    }

    /// Whether one element is smaller than a byte or not a whole number of bytes (fp6, fp4).
    #[inline]
    pub const fn is_subbyte(self) -> bool {
        !self.element_bits().is_multiple_of(8)
    }

    /// Bits one element occupies in memory: its own bits when packed, whole bytes when padded.
    #[inline]
    pub const fn storage_bits(self, packing: Packing) -> u64 {
        let bits = self.element_bits() as u64;
        match packing {
            Packing::Packed => bits,
            Packing::Padded => bits.div_ceil(8) * 8,
        }
    }

    /// Bytes of one element, rounded up for sub-byte types (the DLPack header's
    /// `(bits * lanes + 7) / 8`). For packed sub-byte types see [`DType::packed_group`].
    pub const fn itemsize(self) -> usize {
        self.element_bits().div_ceil(8) as usize
    }

    /// For packed sub-byte types, the smallest group `(elements, bytes)` that fills whole
    /// bytes: fp4 is `(2, 1)`, fp6 is `(4, 3)`. Byte-sized types give `(1, itemsize)`.
    pub const fn packed_group(self) -> (u64, u64) {
        let bits = self.element_bits() as u64;
        let g = gcd(bits, 8);
        (8 / g, bits / g)
    }

    /// Alignment in bytes that a pointer to one element needs: the size of one scalar lane
    /// (half of it for complex, whose halves are floats), 1 for sub-byte and opaque types.
    #[inline]
    pub const fn alignment(self) -> usize {
        if self.is_subbyte() || !self.bits.is_multiple_of(8) {
            return 1;
        }
        let lane = (self.bits / 8) as usize;
        match self.code {
            DTypeCode::OpaqueHandle => 1,
            DTypeCode::Complex => lane / 2,
            _ => lane,
        }
    }
}

const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a
}

/// Aliases accepted by [`str::parse`] besides the canonical names.
static ALIASES: [(&str, DType); 9] = [
    ("half", DType::FLOAT16),
    ("float", DType::FLOAT32),
    ("double", DType::FLOAT64),
    ("bf16", DType::BFLOAT16),
    ("chalf", DType::COMPLEX32),
    ("cfloat", DType::COMPLEX64),
    ("cdouble", DType::COMPLEX128),
    ("byte", DType::UINT8),
    ("long", DType::INT64),
];

/// Canonical names: `int8`..`int64`, `uint8`..`uint64`, `float16`/`float32`/`float64`,
/// `bfloat16`, `complex32`/`complex64`/`complex128`, `bool`, the ml_dtypes names of the
/// fp8/fp6/fp4 types (`float8_e4m3fn`, `float4_e2m1fn`...), `opaque8`..`opaque128`; vector
/// types append `x<lanes>` (`float32x4`).
impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stem = self.code.row().2;
        if self.code.name_has_bits() {
            write!(f, "{stem}{}", self.bits)?;
        } else {
            f.write_str(stem)?;
        }
        if self.lanes != 1 {
            write!(f, "x{}", self.lanes)?;
        }
        Ok(())
    }
}

impl fmt::Debug for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DType({self})")
    }
}

impl FromStr for DType {
    type Err = Error;

    /// Parses the names [`DType`]'s `Display` prints, and the aliases `half`, `float`,
    /// `double`, `bf16`, `chalf`, `cfloat`, `cdouble`, `byte`, `long`. Case-sensitive, as
    /// NumPy and PyTorch are.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let unknown = || Error::UnknownDTypeName { name: s.to_owned() };
        // "complex64" contains an 'x' too: try the whole name as a scalar first.
        if let Some(dt) = parse_scalar(s) {
            return Ok(dt);
        }
        let (head, tail) = s.rsplit_once('x').ok_or_else(unknown)?;
        if tail.is_empty() || !tail.bytes().all(|b| b.is_ascii_digit()) {
            return Err(unknown());
        }
        let lanes: u16 = tail.parse().map_err(|_| unknown())?;
        let scalar = parse_scalar(head).ok_or_else(unknown)?;
        DType::new(scalar.code, scalar.bits, lanes).map_err(|_| unknown())
    }
}

/// A scalar (one-lane) dtype from a canonical name or an alias.
fn parse_scalar(s: &str) -> Option<DType> {
    if let Some((_, dt)) = ALIASES.iter().find(|(name, _)| *name == s) {
        return Some(*dt);
    }
    CODES.iter().find_map(|&(_, code, stem, allowed)| {
        if !code.name_has_bits() {
            return (s == stem).then(|| DType::scalar(code, allowed[0]));
        }
        // The rest must be a plain number, so "float" does not swallow "float8_e4m3fn".
        let rest = s.strip_prefix(stem)?;
        if rest.is_empty() || rest.len() > 3 || !rest.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let bits: u8 = rest.parse().ok()?;
        allowed.contains(&bits).then(|| DType::scalar(code, bits))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_the_known_codes_off_the_tables() {
        assert_eq!(ranges([1, 2, 3, 4, 7, 8, 9]), "1 to 4 or 7 to 9");
        assert_eq!(ranges([5]), "5");
        assert_eq!(ranges([1, 3]), "1 or 3");
        assert_eq!(known_codes(), format!("0 to {}", CODES.len() - 1));
        let msg = Error::UnknownDTypeCode { code: 200 }.to_string();
        assert!(
            msg.ends_with(&format!("(expected {})", known_codes())),
            "{msg}"
        );
    }

    #[test]
    fn every_code_has_its_constant() {
        let constants = [
            DType::FLOAT8_E3M4,
            DType::FLOAT8_E4M3,
            DType::FLOAT8_E4M3B11FNUZ,
            DType::FLOAT8_E4M3FN,
            DType::FLOAT8_E4M3FNUZ,
            DType::FLOAT8_E5M2,
            DType::FLOAT8_E5M2FNUZ,
            DType::FLOAT8_E8M0FNU,
            DType::FLOAT6_E2M3FN,
            DType::FLOAT6_E3M2FN,
            DType::FLOAT4_E2M1FN,
        ];
        for (code, variant, stem, bits) in CODES.iter().skip(7) {
            let c = constants
                .iter()
                .find(|d| d.code() == *variant)
                .unwrap_or_else(|| panic!("no constant for code {code} ({stem})"));
            assert_eq!(DType::new(*variant, bits[0], 1).unwrap(), *c);
            assert_eq!(c.to_string(), *stem);
        }
        assert_eq!(
            DType::new(DTypeCode::Float4E2M1Fn, 4, 2).unwrap(),
            DType::FLOAT4_E2M1FNX2
        );
        assert_eq!(DType::FLOAT4_E2M1FNX2.itemsize(), 1);
    }

    #[test]
    fn every_code_roundtrips_through_its_raw_value() {
        for (raw, code, _, _) in CODES {
            assert_eq!(DTypeCode::from_code(raw).unwrap(), code);
            assert_eq!(code.code(), raw);
        }
        assert!(matches!(
            DTypeCode::from_code(18),
            Err(Error::UnknownDTypeCode { code: 18 })
        ));
    }

    #[test]
    fn every_valid_dtype_name_roundtrips() {
        for (_, code, _, allowed) in CODES {
            for &bits in allowed {
                for lanes in [1u16, 2, 4] {
                    let dt = DType::new(code, bits, lanes).unwrap();
                    let name = dt.to_string();
                    assert_eq!(name.parse::<DType>().unwrap(), dt, "{name}");
                }
            }
        }
    }

    #[test]
    fn conventional_names_parse_to_expected_codes() {
        let cases = [
            ("float32", DType::FLOAT32),
            ("bfloat16", DType::BFLOAT16),
            ("float8_e4m3fn", DType::FLOAT8_E4M3FN),
            ("complex64", DType::COMPLEX64),
            ("bool", DType::BOOL),
            ("uint8", DType::UINT8),
            ("int64", DType::INT64),
            ("float4_e2m1fn", DType::FLOAT4_E2M1FN),
            ("half", DType::FLOAT16),
        ];
        for (name, dt) in cases {
            assert_eq!(name.parse::<DType>().unwrap(), dt, "{name}");
        }
        assert_eq!(
            "float32x4".parse::<DType>().unwrap(),
            DType::new(DTypeCode::Float, 32, 4).unwrap()
        );
    }

    #[test]
    fn bad_names_are_refused_with_the_name() {
        for bad in [
            "", "float", "int7", "float128", "bool16", "x4", "float32x", "Float32",
        ] {
            // "float" alone is an alias for float32, skip it
            if bad == "float" {
                continue;
            }
            let err = bad.parse::<DType>().unwrap_err();
            assert!(
                matches!(&err, Error::UnknownDTypeName { name } if name == bad),
                "{bad}: {err:?}"
            );
        }
        assert!("float32x0".parse::<DType>().is_err());
    }

    #[test]
    fn bit_rules_are_enforced() {
        assert!(matches!(
            DType::from_dlpack(6, 1, 1),
            Err(Error::InvalidBits {
                code: DTypeCode::Bool,
                bits: 1,
                ..
            })
        ));
        assert!(DType::from_dlpack(15, 8, 1).is_err());
        assert!(DType::from_dlpack(17, 8, 1).is_err());
        assert!(DType::from_dlpack(17, 4, 1).is_ok());
        assert!(matches!(
            DType::from_dlpack(2, 32, 0),
            Err(Error::ZeroLanes { .. })
        ));
    }

    #[test]
    fn sizes_groups_and_alignment() {
        assert_eq!(DType::FLOAT32.itemsize(), 4);
        assert_eq!(DType::COMPLEX128.itemsize(), 16);
        assert_eq!(DType::COMPLEX128.alignment(), 8);
        assert_eq!(DType::FLOAT4_E2M1FN.packed_group(), (2, 1));
        let fp6 = DType::from_dlpack(15, 6, 1).unwrap();
        assert_eq!(fp6.packed_group(), (4, 3));
        assert_eq!(fp6.storage_bits(Packing::Packed), 6);
        assert_eq!(fp6.storage_bits(Packing::Padded), 8);
        assert_eq!(DType::FLOAT32.packed_group(), (1, 4));
        assert_eq!(DType::FLOAT4_E2M1FN.alignment(), 1);
        let v = DType::new(DTypeCode::Float, 32, 4).unwrap();
        assert_eq!(v.itemsize(), 16);
        assert_eq!(v.alignment(), 4);
    }
}
