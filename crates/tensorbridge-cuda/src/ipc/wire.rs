//! The share handle on the wire: plain bytes any carrier can move (a pickle, a socket, a queue,
//! an object store), versioned, with a checksum, and decoded by one function that checks
//! everything before anything trusts it. Pure: no driver, no file, no process is touched here.
//!
//! # Layout (version 2, all integers little-endian)
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0 | 8 | magic `TBSHARE\0` |
//! | 8 | 4 | format version (2; version 1 named lifetime files this version no longer reads) |
//! | 12 | 4 | total length in bytes, checksum included (`248 + 16 * ndim`) |
//! | 16 | 4 | flags: bit 0 read-only, bit 1 an interprocess event to wait for, bit 2 padded sub-byte elements; the others 0 |
//! | 20 | 1 | memory: 0 none (a tensor without elements), 1 a legacy CUDA IPC memory handle |
//! | 21 | 1 | ndim (at most 64) |
//! | 22 | 2 | reserved, 0 |
//! | 24 | 4 | dtype: DLPack code (u8), bits (u8), lanes (u16) |
//! | 28 | 4 | producer process id |
//! | 32 | 8 | producer start time (clock ticks after boot, `/proc/<pid>/stat` field 22) |
//! | 40 | 4 | producer user id |
//! | 44 | 4 | lifetime slot index |
//! | 48 | 8 | lifetime slot generation (1 to 2^40 - 1) |
//! | 56 | 8 | lifetime file nonce |
//! | 64 | 8 | allocation size in bytes |
//! | 72 | 8 | base offset: the tensor's data pointer minus the allocation's start |
//! | 80 | 8 | byte offset (the layout's, DLPack's `byte_offset`) |
//! | 88 | 8 | the allocation's start in the producer's address space |
//! | 96 | 16 | device UUID (`cuDeviceGetUuid_v2`) |
//! | 112 | 64 | memory handle (`CUipcMemHandle`) |
//! | 176 | 64 | event handle (`CUipcEventHandle`; zeros without flag bit 1) |
//! | 240 | 8 × ndim | shape |
//! | 240 + 8 × ndim | 8 × ndim | strides, in elements |
//! | 240 + 16 × ndim | 8 | FNV-1a 64 of every byte before it |
//!
//! The checksum catches truncation, padding and accidental corruption (any single changed
//! byte changes an FNV-1a hash: each step is a bijection of the state). It is not a MAC: a
//! handle is a capability that anyone who can read it and run as the same user can use, and
//! whoever can alter it can recompute the checksum. The checks that stand between an altered
//! handle and a wrong mapping are the ones [`IpcHandle::from_bytes`] makes: the layout is
//! validated by the core, and its bytes must lie inside the allocation the handle names.

use std::fmt;

use tensorbridge_core::{Access, DType, Descriptor, Device, Packing, RawTensor};

use crate::Error;
// The UUID is a plain value of the layer's bottom (`types`); named here for the decoder and the
// other files of `ipc`.
pub(crate) use crate::types::DeviceUuid;

/// The first eight bytes of every handle.
pub(crate) const MAGIC: [u8; 8] = *b"TBSHARE\0";
/// The format version this build writes and reads.
pub const VERSION: u32 = 2;
/// Bytes before the shape.
const FIXED: usize = 240;
/// The checksum's bytes.
const TAIL: usize = 8;
/// The shortest handle (a tensor of rank 0).
pub(crate) const MIN_LEN: usize = FIXED + TAIL;
/// The highest rank a handle may carry (bounds the decoder's work and allocation).
pub const MAX_NDIM: usize = 64;
/// Generations fit in 40 bits (the lifetime slot packs them with a ticket count).
pub(crate) const MAX_GENERATION: u64 = (1 << 40) - 1;
/// The largest allocation a handle may name: 2^48 bytes (256 TiB), far above any GPU's
/// memory, and low enough that every offset computation below stays in range.
const MAX_ALLOC: u64 = 1 << 48;
/// Where [`IpcHandle::from_bytes`] pretends the allocation starts, to let the core validate
/// the layout (alignment, overflow, span) before any mapping exists: 2^52, aligned for every
/// dtype, with room below for negative strides and above for `MAX_ALLOC`.
const PRETEND_BASE: usize = 1 << 52;

const FLAG_READONLY: u32 = 1;
const FLAG_EVENT: u32 = 1 << 1;
const FLAG_PADDED: u32 = 1 << 2;
const KNOWN_FLAGS: u32 = FLAG_READONLY | FLAG_EVENT | FLAG_PADDED;

/// A process, told apart from a later one that reuses its id by its start time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProcessId {
    /// The process id.
    pub pid: u32,
    /// When it started, in clock ticks after boot (`/proc/<pid>/stat` field 22); 0 where
    /// `/proc` cannot say.
    pub start: u64,
}

/// How the producer's memory is named in a handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Memory {
    /// No memory: a tensor without elements.
    None,
    /// A legacy CUDA IPC memory handle of the whole allocation (`cuIpcGetMemHandle`).
    Legacy,
}

/// Which share in which producer's lifetime file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SlotRef {
    /// The file's nonce (its name is made of the user, the producer's pid and this).
    pub(crate) nonce: u64,
    /// The slot's index in the file.
    pub(crate) slot: u32,
    /// The share's generation in that slot.
    pub(crate) generation: u64,
}

/// Everything a handle says, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Fields {
    pub(crate) access: Access,
    pub(crate) packing: Packing,
    pub(crate) memory: Memory,
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<i64>,
    pub(crate) strides: Vec<i64>,
    pub(crate) byte_offset: u64,
    pub(crate) producer: ProcessId,
    pub(crate) uid: u32,
    pub(crate) slot: SlotRef,
    pub(crate) alloc_size: u64,
    pub(crate) base_offset: u64,
    pub(crate) producer_base: u64,
    pub(crate) uuid: DeviceUuid,
    pub(crate) mem_handle: [u8; 64],
    /// `Some` when the consumer must wait for the producer's pending work.
    pub(crate) event_handle: Option<[u8; 64]>,
}

/// A share handle: the bytes that let another process of the same user on the same machine
/// map a tensor's memory ([`export`](crate::ipc::export) makes one,
/// [`import`](crate::ipc::import) opens one). Made only by encoding a share or by
/// [`IpcHandle::from_bytes`], which validates everything, so every value here is consistent.
///
/// What a handle grants: any process of the same user on the same machine that holds the
/// bytes can map the tensor's whole allocation, read and write, while the producer keeps the
/// share. Treat the bytes like a file descriptor to that memory. They mean nothing on another
/// machine.
#[derive(Clone, PartialEq, Eq)]
pub struct IpcHandle {
    bytes: Box<[u8]>,
    fields: Fields,
}

impl IpcHandle {
    /// Decodes and validates a handle: length, magic, version, checksum, every field's range,
    /// the layout (by the core: dtype, rank agreement, overflow, alignment) and that the
    /// tensor's bytes lie inside the allocation the handle names. Never panics; every refusal
    /// is a typed [`Error`]. Touches no driver, so it runs anywhere.
    pub fn from_bytes(bytes: &[u8]) -> Result<IpcHandle, Error> {
        let fields = decode(bytes)?;
        Ok(IpcHandle {
            bytes: bytes.into(),
            fields,
        })
    }

    /// The handle's bytes, as [`IpcHandle::from_bytes`] reads them.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The extents.
    pub fn shape(&self) -> &[i64] {
        &self.fields.shape
    }

    /// The strides, in elements.
    pub fn strides_elems(&self) -> &[i64] {
        &self.fields.strides
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.fields.dtype
    }

    /// Whether consumers may only read.
    pub fn is_readonly(&self) -> bool {
        self.fields.access == Access::ReadOnly
    }

    /// The GPU the memory is on.
    pub fn device_uuid(&self) -> DeviceUuid {
        self.fields.uuid
    }

    /// The producing process.
    pub fn producer(&self) -> ProcessId {
        self.fields.producer
    }

    /// The size of the allocation the handle maps (the whole of it, not only the tensor's
    /// bytes: CUDA IPC maps allocations).
    pub fn allocation_size(&self) -> u64 {
        self.fields.alloc_size
    }

    /// Whether the consumer waits (on its stream, on the GPU) for producer work that was
    /// pending when the handle was made.
    pub fn has_pending_work(&self) -> bool {
        self.fields.event_handle.is_some()
    }

    pub(crate) fn fields(&self) -> &Fields {
        &self.fields
    }

    /// The handle of `fields`, encoded.
    pub(crate) fn encode(fields: Fields) -> IpcHandle {
        IpcHandle {
            bytes: encode(&fields).into_boxed_slice(),
            fields,
        }
    }
}

impl fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let x = &self.fields;
        f.debug_struct("IpcHandle")
            .field("dtype", &x.dtype)
            .field("shape", &x.shape.as_slice())
            .field("strides", &x.strides.as_slice())
            .field("device", &x.uuid)
            .field("producer", &x.producer)
            .field("readonly", &(x.access == Access::ReadOnly))
            .field("pending_work", &x.event_handle.is_some())
            .field("len", &self.bytes.len())
            .finish()
    }
}

/// FNV-1a, 64 bits.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The encoded length for a rank.
fn encoded_len(ndim: usize) -> usize {
    FIXED + 16 * ndim + TAIL
}

fn encode(x: &Fields) -> Vec<u8> {
    let ndim = x.shape.len();
    let len = encoded_len(ndim);
    let mut b = Vec::with_capacity(len);
    let mut flags = 0;
    if x.access == Access::ReadOnly {
        flags |= FLAG_READONLY;
    }
    if x.event_handle.is_some() {
        flags |= FLAG_EVENT;
    }
    if x.packing == Packing::Padded {
        flags |= FLAG_PADDED;
    }
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&(len as u32).to_le_bytes());
    b.extend_from_slice(&flags.to_le_bytes());
    b.push(match x.memory {
        Memory::None => 0,
        Memory::Legacy => 1,
    });
    b.push(ndim as u8);
    b.extend_from_slice(&[0, 0]);
    b.push(x.dtype.code().code());
    b.push(x.dtype.bits());
    b.extend_from_slice(&x.dtype.lanes().to_le_bytes());
    b.extend_from_slice(&x.producer.pid.to_le_bytes());
    b.extend_from_slice(&x.producer.start.to_le_bytes());
    b.extend_from_slice(&x.uid.to_le_bytes());
    b.extend_from_slice(&x.slot.slot.to_le_bytes());
    b.extend_from_slice(&x.slot.generation.to_le_bytes());
    b.extend_from_slice(&x.slot.nonce.to_le_bytes());
    b.extend_from_slice(&x.alloc_size.to_le_bytes());
    b.extend_from_slice(&x.base_offset.to_le_bytes());
    b.extend_from_slice(&x.byte_offset.to_le_bytes());
    b.extend_from_slice(&x.producer_base.to_le_bytes());
    b.extend_from_slice(&x.uuid.0);
    b.extend_from_slice(&x.mem_handle);
    b.extend_from_slice(&x.event_handle.unwrap_or([0; 64]));
    debug_assert_eq!(b.len(), FIXED);
    for v in x.shape.iter().chain(x.strides.iter()) {
        b.extend_from_slice(&v.to_le_bytes());
    }
    let sum = fnv1a(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    debug_assert_eq!(b.len(), len);
    b
}

/// A little-endian reader over bytes whose length was checked first (every read is in
/// bounds by construction; a short slice would be a bug here, reported as a length error
/// rather than a panic all the same).
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0; N];
        if let Some(src) = self.b.get(self.at..self.at + N) {
            out.copy_from_slice(src);
        }
        self.at += N;
        out
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    fn i64(&mut self) -> i64 {
        i64::from_le_bytes(self.take())
    }
}

fn field(field: &'static str, value: u64, expected: &'static str) -> Error {
    Error::IpcHandleField {
        field,
        value,
        expected,
    }
}

/// Everything [`IpcHandle::from_bytes`] checks, in order: what can be read before the
/// checksum is trusted (length, magic, version, the declared length), the checksum, then
/// every field.
pub(crate) fn decode(b: &[u8]) -> Result<Fields, Error> {
    let len = b.len();
    if len < MAGIC.len() {
        // A prefix of the magic is a handle cut short; anything else is not a handle.
        return Err(if len > 0 && MAGIC.starts_with(b) {
            Error::IpcHandleLength {
                len,
                expected: MIN_LEN,
            }
        } else {
            Error::IpcNotAHandle { len }
        });
    }
    if b[..MAGIC.len()] != MAGIC {
        return Err(Error::IpcNotAHandle { len });
    }
    if len < 16 {
        return Err(Error::IpcHandleLength {
            len,
            expected: MIN_LEN,
        });
    }
    let mut r = Reader { b, at: 8 };
    let version = r.u32();
    if version != VERSION {
        return Err(Error::IpcHandleVersion {
            found: version,
            expected: VERSION,
        });
    }
    let declared = r.u32() as usize;
    if declared != len || len < MIN_LEN {
        return Err(Error::IpcHandleLength {
            len,
            expected: declared.max(MIN_LEN),
        });
    }
    let body = len - TAIL;
    let computed = fnv1a(&b[..body]);
    let found = u64::from_le_bytes(b[body..].try_into().map_err(|_| Error::IpcHandleLength {
        len,
        expected: MIN_LEN,
    })?);
    if found != computed {
        return Err(Error::IpcHandleChecksum { found, computed });
    }

    let flags = r.u32();
    if flags & !KNOWN_FLAGS != 0 {
        return Err(field("flags", u64::from(flags), "bits 0 to 2 only"));
    }
    let memory = match r.u8() {
        0 => Memory::None,
        1 => Memory::Legacy,
        m => return Err(field("memory kind", u64::from(m), "0 or 1")),
    };
    let ndim = usize::from(r.u8());
    if ndim > MAX_NDIM {
        return Err(field("rank", ndim as u64, "at most 64"));
    }
    if len != encoded_len(ndim) {
        return Err(Error::IpcHandleLength {
            len,
            expected: encoded_len(ndim),
        });
    }
    let reserved = r.u16();
    if reserved != 0 {
        return Err(field("reserved bytes", u64::from(reserved), "0"));
    }
    let (code, bits, lanes) = (r.u8(), r.u8(), r.u16());
    // A dtype no producer writes is a damaged handle, not a wrong kind of object: a field
    // error (the core's reason is in the value: code, bits and lanes packed as 0xCCBBLLLL).
    let dtype = DType::from_dlpack(code, bits, lanes).map_err(|_| {
        field(
            "dtype (code << 24 | bits << 16 | lanes)",
            u64::from(code) << 24 | u64::from(bits) << 16 | u64::from(lanes),
            "a DLPack dtype the core knows",
        )
    })?;
    let pid = r.u32();
    let start = r.u64();
    if pid == 0 {
        return Err(field("producer process id", 0, "a process id above 0"));
    }
    let uid = r.u32();
    let slot = r.u32();
    let generation = r.u64();
    let nonce = r.u64();
    let alloc_size = r.u64();
    let base_offset = r.u64();
    let byte_offset = r.u64();
    let producer_base = r.u64();
    let uuid = DeviceUuid(r.take());
    let mem_handle: [u8; 64] = r.take();
    let event_handle: [u8; 64] = r.take();
    let mut shape = Vec::with_capacity(ndim);
    for _ in 0..ndim {
        shape.push(r.i64());
    }
    let mut strides = Vec::with_capacity(ndim);
    for _ in 0..ndim {
        strides.push(r.i64());
    }
    let has_event = flags & FLAG_EVENT != 0;
    if !has_event && event_handle != [0; 64] {
        return Err(field("event handle", 1, "zeros when no event is flagged"));
    }
    let packing = if flags & FLAG_PADDED != 0 {
        Packing::Padded
    } else {
        Packing::Packed
    };
    let access = if flags & FLAG_READONLY != 0 {
        Access::ReadOnly
    } else {
        Access::ReadWrite
    };
    match memory {
        Memory::None => {
            if alloc_size != 0 || base_offset != 0 || producer_base != 0 {
                return Err(field(
                    "allocation size",
                    alloc_size,
                    "0 for a tensor without memory",
                ));
            }
            if has_event {
                return Err(field("flags", u64::from(flags), "no event without memory"));
            }
            if !shape.contains(&0) {
                return Err(field("memory kind", 0, "1 for a tensor with elements"));
            }
        }
        Memory::Legacy => {
            if alloc_size == 0 || alloc_size > MAX_ALLOC {
                return Err(field("allocation size", alloc_size, "1 to 2^48 bytes"));
            }
            if base_offset >= alloc_size {
                return Err(field(
                    "base offset",
                    base_offset,
                    "less than the allocation size",
                ));
            }
            if producer_base == 0 || producer_base.checked_add(alloc_size).is_none() {
                return Err(field(
                    "allocation start",
                    producer_base,
                    "an address above 0 with room for the allocation",
                ));
            }
            if generation == 0 || generation > MAX_GENERATION {
                return Err(field("slot generation", generation, "1 to 2^40 - 1"));
            }
        }
    }
    let fields = Fields {
        access,
        packing,
        memory,
        dtype,
        shape,
        strides,
        byte_offset,
        producer: ProcessId { pid, start },
        uid,
        slot: SlotRef {
            nonce,
            slot,
            generation,
        },
        alloc_size,
        base_offset,
        producer_base,
        uuid,
        mem_handle,
        event_handle: has_event.then_some(event_handle),
    };
    // The layout, validated by the core against a pretended allocation start.
    let desc = fields.descriptor_at(PRETEND_BASE, Device::cuda(0))?;
    if memory == Memory::Legacy && desc.numel() > 0 {
        let span = desc.byte_span();
        let lo = span.start as i128 - PRETEND_BASE as i128;
        let hi = span.end as i128 - PRETEND_BASE as i128;
        if lo < 0 || hi > i128::from(alloc_size) {
            return Err(Error::IpcHandleSpan {
                lo,
                hi,
                size: alloc_size,
            });
        }
    }
    Ok(fields)
}

impl Fields {
    /// The tensor's descriptor for an allocation that starts at `base` on `device` (or, for
    /// a tensor without memory, a null pointer), validated by the core.
    pub(crate) fn descriptor_at(&self, base: usize, device: Device) -> Result<Descriptor, Error> {
        let data = match self.memory {
            Memory::None => 0,
            // `base_offset < alloc_size <= 2^48` (checked), so this cannot overflow for the
            // pretended base, and for a real mapping of `alloc_size` bytes it is inside it.
            Memory::Legacy => base.checked_add(self.base_offset as usize).ok_or(field(
                "base offset",
                self.base_offset,
                "inside the address space",
            ))?,
        };
        let raw = RawTensor {
            strides: Some(&self.strides),
            byte_offset: self.byte_offset,
            access: self.access,
            packing: self.packing,
            ..RawTensor::new(data, device, self.dtype, &self.shape)
        };
        Ok(raw.validate()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ndim: usize) -> Fields {
        let shape: Vec<i64> = (0..ndim).map(|i| i as i64 + 2).collect();
        let layout = tensorbridge_core::Layout::row_major(&shape).unwrap();
        Fields {
            access: Access::ReadWrite,
            packing: Packing::Packed,
            memory: Memory::Legacy,
            dtype: DType::FLOAT32,
            strides: layout.strides_elems().to_vec(),
            shape,
            byte_offset: 0,
            producer: ProcessId {
                pid: 4242,
                start: 99,
            },
            uid: 1000,
            slot: SlotRef {
                nonce: 0xfeed,
                slot: 3,
                generation: 7,
            },
            alloc_size: 1 << 40,
            base_offset: 4096,
            producer_base: 0x7f00_0000_0000,
            uuid: DeviceUuid([0xab; 16]),
            mem_handle: [7; 64],
            event_handle: Some([9; 64]),
        }
    }

    #[test]
    fn encode_decode_roundtrip() {
        for ndim in [0, 1, 3, 8, 9, MAX_NDIM] {
            let mut x = sample(ndim.min(12));
            if ndim == MAX_NDIM {
                x.shape = std::iter::repeat_n(1, MAX_NDIM).collect();
                x.strides = std::iter::repeat_n(1, MAX_NDIM).collect();
            }
            let h = IpcHandle::encode(x.clone());
            assert_eq!(h.as_bytes().len(), encoded_len(x.shape.len()));
            let back = IpcHandle::from_bytes(h.as_bytes()).unwrap();
            assert_eq!(back.fields, x);
            assert_eq!(back, h);
        }
    }

    #[test]
    fn uuid_prints_like_nvidia_smi() {
        let u = DeviceUuid([
            0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ]);
        assert_eq!(u.to_string(), "GPU-01234567-89ab-cdef-0123-456789abcdef");
    }

    #[test]
    fn fnv_reference_values() {
        // The published FNV-1a 64 test vectors.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
