//! NumPy's `typestr` grammar (`<byteorder><kind><size>`), shared by both interfaces, and
//! its mapping to and from the core's dtypes.

use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;

use tensorbridge_core::{DType, DTypeCode, Packing};

use crate::{Error, ImportOptions};

/// The first character of a typestr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ByteOrder {
    /// `<`: little-endian.
    Little,
    /// `>`: big-endian.
    Big,
    /// `=`: the machine's own order.
    Native,
    /// `|`: not applicable (one-byte items, raw bytes, objects). NumPy reads it as native
    /// when the items are wider.
    NotApplicable,
}

impl ByteOrder {
    /// The explicit order of this machine: `<` on little-endian targets, `>` on big-endian.
    pub const HOST: ByteOrder = if cfg!(target_endian = "big") {
        ByteOrder::Big
    } else {
        ByteOrder::Little
    };

    /// The character: `<`, `>`, `=` or `|`.
    pub const fn as_char(self) -> char {
        match self {
            ByteOrder::Little => '<',
            ByteOrder::Big => '>',
            ByteOrder::Native => '=',
            ByteOrder::NotApplicable => '|',
        }
    }

    /// The order for a character, `None` for anything but `<`, `>`, `=` and `|`.
    pub const fn from_char(c: char) -> Option<ByteOrder> {
        match c {
            '<' => Some(ByteOrder::Little),
            '>' => Some(ByteOrder::Big),
            '=' => Some(ByteOrder::Native),
            '|' => Some(ByteOrder::NotApplicable),
            _ => None,
        }
    }

    /// Whether multi-byte items in this order can be read on this machine as they are:
    /// native (`=`), not applicable (`|`, which NumPy reads as native) or the host's own.
    pub fn is_host_readable(self) -> bool {
        match self {
            ByteOrder::Native | ByteOrder::NotApplicable => true,
            explicit => explicit == ByteOrder::HOST,
        }
    }

    /// `little-endian`, `big-endian`, `native` or `not applicable`, for messages.
    pub(crate) const fn describe(self) -> &'static str {
        match self {
            ByteOrder::Little => "little-endian",
            ByteOrder::Big => "big-endian",
            ByteOrder::Native => "native",
            ByteOrder::NotApplicable => "not applicable",
        }
    }
}

/// The endianness of this machine, for messages.
pub(crate) const HOST_ENDIAN: &str = ByteOrder::HOST.describe();

/// A calendar or clock unit of NumPy's `datetime64` / `timedelta64` (`[ns]` in `<M8[ns]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimeUnit {
    /// `Y`.
    Years,
    /// `M`.
    Months,
    /// `W`.
    Weeks,
    /// `D`.
    Days,
    /// `h`.
    Hours,
    /// `m`.
    Minutes,
    /// `s`.
    Seconds,
    /// `ms`.
    Milliseconds,
    /// `us`.
    Microseconds,
    /// `ns`.
    Nanoseconds,
    /// `ps`.
    Picoseconds,
    /// `fs`.
    Femtoseconds,
    /// `as`.
    Attoseconds,
}

const TIME_UNITS: [(TimeUnit, &str); 13] = [
    (TimeUnit::Years, "Y"),
    (TimeUnit::Months, "M"),
    (TimeUnit::Weeks, "W"),
    (TimeUnit::Days, "D"),
    (TimeUnit::Hours, "h"),
    (TimeUnit::Minutes, "m"),
    (TimeUnit::Seconds, "s"),
    (TimeUnit::Milliseconds, "ms"),
    (TimeUnit::Microseconds, "us"),
    (TimeUnit::Nanoseconds, "ns"),
    (TimeUnit::Picoseconds, "ps"),
    (TimeUnit::Femtoseconds, "fs"),
    (TimeUnit::Attoseconds, "as"),
];

impl TimeUnit {
    /// NumPy's abbreviation (`ns`, `D`...).
    pub fn as_str(self) -> &'static str {
        TIME_UNITS
            .iter()
            .find(|(u, _)| *u == self)
            .map_or("", |(_, s)| s)
    }

    fn from_abbrev(s: &str) -> Option<TimeUnit> {
        TIME_UNITS.iter().find(|(_, a)| *a == s).map(|(u, _)| *u)
    }
}

/// The bracketed unit of a datetime or timedelta typestr: `[ns]`, `[10ms]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DateTimeUnit {
    /// How many `unit`s one tick is (`10` in `[10ms]`; printed only when not 1).
    pub count: NonZeroU32,
    /// The base unit.
    pub unit: TimeUnit,
}

/// The second character of a typestr: what the bytes mean.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TypeKind {
    /// `t`: bit field (the size counts bits).
    Bitfield,
    /// `b`: boolean.
    Bool,
    /// `i`: signed integer.
    Int,
    /// `u`: unsigned integer.
    UInt,
    /// `f`: floating point.
    Float,
    /// `c`: complex floating point (the size counts both halves).
    Complex,
    /// `m`: timedelta, with an optional unit (`<m8[ns]`; none for NumPy's generic unit).
    Timedelta(Option<DateTimeUnit>),
    /// `M`: datetime, with an optional unit (`<M8[ns]`).
    Datetime(Option<DateTimeUnit>),
    /// `O`: Python object pointer.
    Object,
    /// `S`: fixed-length bytes.
    Bytes,
    /// `U`: fixed-length UCS4 string (the size counts characters).
    Unicode,
    /// `V`: raw bytes ("void"), which is how bfloat16 and the fp8 types travel.
    Void,
}

impl TypeKind {
    /// The character, `t b i u f c m M O S U V`.
    pub const fn as_char(self) -> char {
        match self {
            TypeKind::Bitfield => 't',
            TypeKind::Bool => 'b',
            TypeKind::Int => 'i',
            TypeKind::UInt => 'u',
            TypeKind::Float => 'f',
            TypeKind::Complex => 'c',
            TypeKind::Timedelta(_) => 'm',
            TypeKind::Datetime(_) => 'M',
            TypeKind::Object => 'O',
            TypeKind::Bytes => 'S',
            TypeKind::Unicode => 'U',
            TypeKind::Void => 'V',
        }
    }

    /// The kind for a character (datetime kinds without a unit), `None` for other characters.
    pub const fn from_char(c: char) -> Option<TypeKind> {
        Some(match c {
            't' => TypeKind::Bitfield,
            'b' => TypeKind::Bool,
            'i' => TypeKind::Int,
            'u' => TypeKind::UInt,
            'f' => TypeKind::Float,
            'c' => TypeKind::Complex,
            'm' => TypeKind::Timedelta(None),
            'M' => TypeKind::Datetime(None),
            'O' => TypeKind::Object,
            'S' => TypeKind::Bytes,
            'U' => TypeKind::Unicode,
            'V' => TypeKind::Void,
            _ => return None,
        })
    }

    fn unit(self) -> Option<DateTimeUnit> {
        match self {
            TypeKind::Timedelta(u) | TypeKind::Datetime(u) => u,
            _ => None,
        }
    }
}

/// A parsed typestr: `<f4`, `|b1`, `<V2`, `<M8[ns]`, `|O`.
///
/// Every value prints (`Display`) as a string that parses (`FromStr`) back to it, and every
/// typestr NumPy prints parses and prints back unchanged. Parsing is a little more lenient
/// than printing: `[1ns]` and leading zeros in the size are accepted and printed canonically.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TypeStr {
    /// `<`, `>`, `=` or `|`.
    pub byte_order: ByteOrder,
    /// What the bytes mean.
    pub kind: TypeKind,
    /// Bytes per item, except for `t` (bits) and `U` (characters). `None` where NumPy
    /// omits it (`|O`); such a typestr names no dtype.
    pub size: Option<u64>,
}

/// What is wrong with a typestr that does not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TypeStrProblem {
    /// The string is empty.
    Empty,
    /// The first character is not a byte order.
    ByteOrder(char),
    /// Nothing follows the byte order.
    MissingKind,
    /// The second character is not a kind.
    Kind(char),
    /// The size is not a number that fits in 64 bits.
    Size,
    /// A bracketed unit on a kind other than `m` and `M`, or one NumPy does not know.
    Unit,
    /// Characters after the size (or unit).
    Trailing,
}

impl fmt::Display for TypeStrProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TypeStrProblem::Empty => f.write_str("it is empty"),
            TypeStrProblem::ByteOrder(c) => {
                write!(f, "byte order {c:?} is not one of '<', '>', '=', '|'")
            }
            TypeStrProblem::MissingKind => f.write_str("no kind follows the byte order"),
            TypeStrProblem::Kind(c) => write!(
                f,
                "kind {c:?} is not one of 't', 'b', 'i', 'u', 'f', 'c', 'm', 'M', 'O', 'S', 'U', 'V'"
            ),
            TypeStrProblem::Size => f.write_str("the size is not an integer below 2^64"),
            TypeStrProblem::Unit => f.write_str(
                "the bracketed unit is not a datetime unit such as [ns] or [10ms] on kind 'm' or 'M'",
            ),
            TypeStrProblem::Trailing => f.write_str("characters follow the size"),
        }
    }
}

impl TypeStr {
    /// A typestr from its parts (datetime kinds carry their unit in [`TypeKind`]).
    pub const fn new(byte_order: ByteOrder, kind: TypeKind, size: u64) -> TypeStr {
        TypeStr {
            byte_order,
            kind,
            size: Some(size),
        }
    }

    /// The default `descr` NumPy gives every non-structured dtype: `[('', typestr)]`.
    pub fn default_descr(self) -> Vec<crate::DescrField> {
        vec![crate::DescrField {
            name: String::new(),
            format: crate::DescrFormat::TypeStr(self),
            shape: None,
        }]
    }

    /// The typestr a core dtype is exported as; see the crate docs' table.
    ///
    /// Fails with [`Error::NoTypeStr`] for dtypes no convention names: complex32, the
    /// fp8/fp6/fp4 family and vector (multi-lane) types.
    pub fn from_dtype(dtype: DType) -> Result<TypeStr, Error> {
        let none = Err(Error::NoTypeStr { dtype });
        if dtype.lanes() != 1 {
            return none;
        }
        let bytes = u64::from(dtype.bits() / 8);
        let order = if bytes == 1 {
            ByteOrder::NotApplicable
        } else {
            ByteOrder::HOST
        };
        let kind = match (dtype.code(), dtype.bits()) {
            (DTypeCode::Bool, 8) => TypeKind::Bool,
            (DTypeCode::Int, _) => TypeKind::Int,
            (DTypeCode::UInt, _) => TypeKind::UInt,
            (DTypeCode::Float, _) => TypeKind::Float,
            (DTypeCode::Complex, 64 | 128) => TypeKind::Complex,
            // ml_dtypes' `.str`, which CuPy 14 and PyTorch 2.11 export as is.
            (DTypeCode::Bfloat, 16) => return Ok(TypeStr::new(ByteOrder::HOST, TypeKind::Void, 2)),
            // Bytes whose meaning the parties agree on: NumPy's plain void.
            (DTypeCode::OpaqueHandle, _) => {
                return Ok(TypeStr::new(
                    ByteOrder::NotApplicable,
                    TypeKind::Void,
                    bytes,
                ));
            }
            _ => return none,
        };
        Ok(TypeStr::new(order, kind, bytes))
    }

    /// The core dtype this typestr names.
    ///
    /// `V` (raw bytes) becomes `options.void_as` when its size matches, and is refused
    /// otherwise ([`Error::VoidNeedsDType`], [`Error::VoidSizeMismatch`]): the bytes do not
    /// say whether they are bfloat16, an fp8 type or something else. A non-native byte order
    /// is refused ([`Error::NonNativeByteOrder`]) unless the dtype's scalars are single bytes.
    pub fn to_dtype(&self, options: &ImportOptions) -> Result<DType, Error> {
        let unsupported = || Error::UnsupportedTypeStr { typestr: *self };
        let size = self.size.ok_or_else(unsupported)?;
        let dtype = match (self.kind, size) {
            (TypeKind::Bool, 1) => DType::BOOL,
            (TypeKind::Int, 1) => DType::INT8,
            (TypeKind::Int, 2) => DType::INT16,
            (TypeKind::Int, 4) => DType::INT32,
            (TypeKind::Int, 8) => DType::INT64,
            (TypeKind::UInt, 1) => DType::UINT8,
            (TypeKind::UInt, 2) => DType::UINT16,
            (TypeKind::UInt, 4) => DType::UINT32,
            (TypeKind::UInt, 8) => DType::UINT64,
            (TypeKind::Float, 2) => DType::FLOAT16,
            (TypeKind::Float, 4) => DType::FLOAT32,
            (TypeKind::Float, 8) => DType::FLOAT64,
            (TypeKind::Complex, 8) => DType::COMPLEX64,
            (TypeKind::Complex, 16) => DType::COMPLEX128,
            (TypeKind::Void, _) => {
                let dtype = options
                    .void_as
                    .ok_or(Error::VoidNeedsDType { typestr: *self })?;
                if padded_itemsize(dtype) != size {
                    return Err(Error::VoidSizeMismatch {
                        typestr: *self,
                        dtype,
                    });
                }
                dtype
            }
            _ => return Err(unsupported()),
        };
        if !self.byte_order.is_host_readable() && scalar_bytes(dtype) > 1 {
            return Err(Error::NonNativeByteOrder { typestr: *self });
        }
        Ok(dtype)
    }
}

/// Bytes one element occupies when sub-byte types get a byte each (ml_dtypes' layout of
/// fp4/fp6, DLPack's padded flag): the size a `V` typestr must have for `dtype`.
pub(crate) fn padded_itemsize(dtype: DType) -> u64 {
    dtype.storage_bits(Packing::Padded) / 8
}

/// Bytes of one scalar whose byte order matters: a lane, half a lane for complex, one for
/// opaque bytes and sub-byte types.
fn scalar_bytes(dtype: DType) -> u8 {
    match dtype.code() {
        DTypeCode::OpaqueHandle => 1,
        DTypeCode::Complex => dtype.bits() / 16,
        _ => (dtype.bits() / 8).max(1),
    }
}

impl fmt::Display for TypeStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.byte_order.as_char(), self.kind.as_char())?;
        if let Some(size) = self.size {
            write!(f, "{size}")?;
        }
        if let Some(DateTimeUnit { count, unit }) = self.kind.unit() {
            f.write_str("[")?;
            if count.get() != 1 {
                write!(f, "{count}")?;
            }
            write!(f, "{}]", unit.as_str())?;
        }
        Ok(())
    }
}

impl FromStr for TypeStr {
    type Err = Error;

    /// Parses `<byteorder><kind><size>` with every byte order (`< > = |`) and kind
    /// (`t b i u f c m M O S U V`) of the grammar, NumPy's bracketed datetime units
    /// (`<M8[ns]`) and a missing size (`|O`). Never panics.
    fn from_str(s: &str) -> Result<TypeStr, Error> {
        let bad = |problem| Error::MalformedTypeStr {
            typestr: s.to_owned(),
            problem,
        };
        let mut chars = s.chars();
        let order_char = chars.next().ok_or(bad(TypeStrProblem::Empty))?;
        let byte_order =
            ByteOrder::from_char(order_char).ok_or(bad(TypeStrProblem::ByteOrder(order_char)))?;
        let kind_char = chars.next().ok_or(bad(TypeStrProblem::MissingKind))?;
        let mut kind =
            TypeKind::from_char(kind_char).ok_or(bad(TypeStrProblem::Kind(kind_char)))?;
        let rest = chars.as_str();
        let digits_end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (digits, rest) = rest.split_at(digits_end);
        let size = if digits.is_empty() {
            None
        } else {
            Some(
                digits
                    .parse::<u64>()
                    .map_err(|_| bad(TypeStrProblem::Size))?,
            )
        };
        if !rest.is_empty() {
            if !rest.starts_with('[') {
                return Err(bad(TypeStrProblem::Trailing));
            }
            let unit = parse_unit(rest).ok_or(bad(TypeStrProblem::Unit))?;
            kind = match kind {
                TypeKind::Timedelta(None) => TypeKind::Timedelta(Some(unit)),
                TypeKind::Datetime(None) => TypeKind::Datetime(Some(unit)),
                _ => return Err(bad(TypeStrProblem::Unit)),
            };
        }
        Ok(TypeStr {
            byte_order,
            kind,
            size,
        })
    }
}

/// `[ns]`, `[10ms]`: the whole rest of the string.
fn parse_unit(s: &str) -> Option<DateTimeUnit> {
    let inner = s.strip_prefix('[')?.strip_suffix(']')?;
    let split = inner.find(|c: char| !c.is_ascii_digit())?;
    let (count, abbrev) = inner.split_at(split);
    let count = if count.is_empty() {
        NonZeroU32::MIN
    } else {
        count.parse::<NonZeroU32>().ok()?
    };
    Some(DateTimeUnit {
        count,
        unit: TimeUnit::from_abbrev(abbrev)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_time_unit_has_an_abbreviation_that_parses_back() {
        for (unit, abbrev) in TIME_UNITS {
            assert_eq!(unit.as_str(), abbrev);
            assert_eq!(TimeUnit::from_abbrev(abbrev), Some(unit));
        }
    }

    #[test]
    fn every_kind_and_byte_order_character_roundtrips() {
        for c in "tbiufcmMOSUV".chars() {
            assert_eq!(TypeKind::from_char(c).map(TypeKind::as_char), Some(c));
        }
        for c in "<>=|".chars() {
            assert_eq!(ByteOrder::from_char(c).map(ByteOrder::as_char), Some(c));
        }
        assert_eq!(TypeKind::from_char('x'), None);
        assert_eq!(ByteOrder::from_char('!'), None);
    }

    #[test]
    fn units_parse_only_in_brackets_with_a_known_abbreviation() {
        let ns = DateTimeUnit {
            count: NonZeroU32::MIN,
            unit: TimeUnit::Nanoseconds,
        };
        assert_eq!(parse_unit("[ns]"), Some(ns));
        assert_eq!(parse_unit("[1ns]"), Some(ns));
        assert_eq!(parse_unit("[10ms]").map(|u| u.count.get()), Some(10));
        for bad in [
            "[]",
            "[0ns]",
            "[ns",
            "ns]",
            "[10]",
            "[xs]",
            "[ns]x",
            "[99999999999ns]",
        ] {
            assert_eq!(parse_unit(bad), None, "{bad}");
        }
    }

    #[test]
    fn byte_order_matters_only_for_multi_byte_scalars() {
        assert_eq!(scalar_bytes(DType::INT8), 1);
        assert_eq!(scalar_bytes(DType::COMPLEX64), 4);
        assert_eq!(scalar_bytes(DType::BFLOAT16), 2);
        assert_eq!(scalar_bytes(DType::FLOAT4_E2M1FN), 1);
        let opaque = DType::new(DTypeCode::OpaqueHandle, 64, 1).unwrap();
        assert_eq!(scalar_bytes(opaque), 1);
        assert_eq!(padded_itemsize(DType::FLOAT4_E2M1FN), 1);
        assert_eq!(padded_itemsize(DType::BFLOAT16), 2);
    }
}
