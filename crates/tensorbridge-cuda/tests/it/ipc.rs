//! Share handles without a GPU: the format as `ipc/wire.rs` documents it (an encoder written
//! here from that table, independently of the crate's), every refusal of the decoder, and
//! that no byte string (arbitrary, truncated, altered, altered with the checksum recomputed)
//! makes it panic. On a machine without a driver, export and import say so.

use proptest::prelude::*;
use tensorbridge_core::{Access, DType, Descriptor, Device, Layout, Packing, Stream};
use tensorbridge_cuda::Error;
use tensorbridge_cuda::ipc::{self, IpcHandle};

/// The fields of a version-2 handle, as the format table names them.
#[derive(Clone, Debug)]
struct Spec {
    flags: u32,
    memory: u8,
    dtype: (u8, u8, u16),
    pid: u32,
    start: u64,
    uid: u32,
    slot: u32,
    generation: u64,
    nonce: u64,
    alloc_size: u64,
    base_offset: u64,
    byte_offset: u64,
    producer_base: u64,
    uuid: [u8; 16],
    mem_handle: [u8; 64],
    event_handle: [u8; 64],
    shape: Vec<i64>,
    strides: Vec<i64>,
    reserved: u16,
}

/// A float32 (3, 4) tensor, row-major, 1 KiB into a 2 MiB allocation, with an event.
fn spec() -> Spec {
    Spec {
        flags: 0b10,
        memory: 1,
        dtype: (2, 32, 1),
        pid: 31337,
        start: 123_456,
        uid: 1000,
        slot: 12,
        generation: 77,
        nonce: 0x0123_4567_89ab_cdef,
        alloc_size: 2 << 20,
        base_offset: 1024,
        byte_offset: 0,
        producer_base: 0x7f12_0000_0000,
        uuid: *b"0123456789abcdef",
        mem_handle: [0x5a; 64],
        event_handle: [0xa5; 64],
        shape: vec![3, 4],
        strides: vec![4, 1],
        reserved: 0,
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
    }
    h
}

/// Encodes `s` by the table, with `len` as the declared length (the real one when `None`).
fn encode_declared(s: &Spec, declared: Option<u32>) -> Vec<u8> {
    let ndim = s.shape.len();
    let len = 248 + 16 * ndim;
    let mut b = Vec::new();
    b.extend_from_slice(b"TBSHARE\0");
    b.extend_from_slice(&2u32.to_le_bytes());
    b.extend_from_slice(&declared.unwrap_or(len as u32).to_le_bytes());
    b.extend_from_slice(&s.flags.to_le_bytes());
    b.push(s.memory);
    b.push(ndim as u8);
    b.extend_from_slice(&s.reserved.to_le_bytes());
    b.push(s.dtype.0);
    b.push(s.dtype.1);
    b.extend_from_slice(&s.dtype.2.to_le_bytes());
    b.extend_from_slice(&s.pid.to_le_bytes());
    b.extend_from_slice(&s.start.to_le_bytes());
    b.extend_from_slice(&s.uid.to_le_bytes());
    b.extend_from_slice(&s.slot.to_le_bytes());
    b.extend_from_slice(&s.generation.to_le_bytes());
    b.extend_from_slice(&s.nonce.to_le_bytes());
    b.extend_from_slice(&s.alloc_size.to_le_bytes());
    b.extend_from_slice(&s.base_offset.to_le_bytes());
    b.extend_from_slice(&s.byte_offset.to_le_bytes());
    b.extend_from_slice(&s.producer_base.to_le_bytes());
    b.extend_from_slice(&s.uuid);
    b.extend_from_slice(&s.mem_handle);
    b.extend_from_slice(&s.event_handle);
    assert_eq!(b.len(), 240, "the fixed part is 240 bytes");
    for v in s.shape.iter().chain(&s.strides) {
        b.extend_from_slice(&v.to_le_bytes());
    }
    let sum = fnv1a(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}

fn encode(s: &Spec) -> Vec<u8> {
    encode_declared(s, None)
}

/// Rewrites the checksum after an alteration, as a forger would.
fn reseal(b: &mut [u8]) {
    let n = b.len() - 8;
    let sum = fnv1a(&b[..n]);
    b[n..].copy_from_slice(&sum.to_le_bytes());
}

#[test]
fn the_documented_format_decodes() {
    let bytes = encode(&spec());
    let h = IpcHandle::from_bytes(&bytes).unwrap();
    assert_eq!(h.as_bytes(), &bytes[..]);
    assert_eq!(h.shape(), [3, 4]);
    assert_eq!(h.strides_elems(), [4, 1]);
    assert_eq!(h.dtype(), DType::FLOAT32);
    assert!(!h.is_readonly());
    assert!(h.has_pending_work());
    assert_eq!(h.allocation_size(), 2 << 20);
    assert_eq!(h.producer().pid, 31337);
    assert_eq!(h.producer().start, 123_456);
    assert_eq!(
        h.device_uuid().to_string(),
        "GPU-30313233-3435-3637-3839-616263646566"
    );
    let ro = IpcHandle::from_bytes(&encode(&Spec {
        flags: 0b01,
        event_handle: [0; 64],
        ..spec()
    }))
    .unwrap();
    assert!(ro.is_readonly() && !ro.has_pending_work());
    // A tensor without elements names no memory.
    let empty = Spec {
        flags: 0,
        memory: 0,
        alloc_size: 0,
        base_offset: 0,
        producer_base: 0,
        event_handle: [0; 64],
        shape: vec![0, 5],
        strides: vec![5, 1],
        ..spec()
    };
    assert_eq!(
        IpcHandle::from_bytes(&encode(&empty)).unwrap().shape(),
        [0, 5]
    );
}

#[test]
fn every_truncation_and_padding_is_refused() {
    let bytes = encode(&spec());
    for n in 0..bytes.len() {
        let r = IpcHandle::from_bytes(&bytes[..n]);
        match r {
            Err(Error::IpcHandleLength { len, .. }) => assert_eq!(len, n),
            Err(Error::IpcNotAHandle { len: 0 }) => assert_eq!(n, 0),
            other => panic!("{n} bytes: {other:?}"),
        }
    }
    let mut padded = bytes.clone();
    padded.push(0);
    assert!(matches!(
        IpcHandle::from_bytes(&padded),
        Err(Error::IpcHandleLength { len, expected }) if len == bytes.len() + 1 && expected == bytes.len()
    ));
    assert!(matches!(
        IpcHandle::from_bytes(b"not a handle at all, just some bytes"),
        Err(Error::IpcNotAHandle { len: 36 })
    ));
}

#[test]
fn every_changed_byte_is_refused() {
    let bytes = encode(&spec());
    for i in 0..bytes.len() {
        for mask in [0x01u8, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[i] ^= mask;
            assert!(
                IpcHandle::from_bytes(&b).is_err(),
                "byte {i} ^ {mask:#x} went through"
            );
        }
    }
    let mut b = bytes.clone();
    b[100] ^= 1;
    assert!(matches!(
        IpcHandle::from_bytes(&b),
        Err(Error::IpcHandleChecksum { .. })
    ));
    // Version 1 (lifetime files by name in /dev/shm itself): refused, not misread.
    let mut v1 = bytes;
    v1[8] = 1;
    assert!(matches!(
        IpcHandle::from_bytes(&v1),
        Err(Error::IpcHandleVersion {
            found: 1,
            expected: 2
        })
    ));
}

/// Altered fields with the checksum recomputed: the field checks refuse each.
#[test]
fn forged_fields_are_refused() {
    let field = |s: Spec, name: &str| {
        let r = IpcHandle::from_bytes(&encode(&s));
        match r {
            Err(Error::IpcHandleField { field, .. }) if field == name => {}
            other => panic!("{name}: {other:?}"),
        }
    };
    field(
        Spec {
            flags: 1 << 3,
            ..spec()
        },
        "flags",
    );
    field(
        Spec {
            memory: 2,
            ..spec()
        },
        "memory kind",
    );
    field(
        Spec {
            reserved: 1,
            ..spec()
        },
        "reserved bytes",
    );
    field(Spec { pid: 0, ..spec() }, "producer process id");
    field(
        Spec {
            alloc_size: 0,
            ..spec()
        },
        "allocation size",
    );
    field(
        Spec {
            alloc_size: (1 << 48) + 1,
            ..spec()
        },
        "allocation size",
    );
    field(
        Spec {
            base_offset: 2 << 20,
            ..spec()
        },
        "base offset",
    );
    field(
        Spec {
            producer_base: 0,
            ..spec()
        },
        "allocation start",
    );
    field(
        Spec {
            producer_base: u64::MAX - 4096,
            ..spec()
        },
        "allocation start",
    );
    field(
        Spec {
            generation: 0,
            ..spec()
        },
        "slot generation",
    );
    field(
        Spec {
            generation: 1 << 40,
            ..spec()
        },
        "slot generation",
    );
    field(Spec { flags: 0, ..spec() }, "event handle");
    field(
        Spec {
            memory: 0,
            alloc_size: 0,
            base_offset: 0,
            producer_base: 0,
            flags: 0,
            event_handle: [0; 64],
            ..spec()
        },
        "memory kind",
    );
    // The tensor outside its allocation: past the end, before the start.
    let past = IpcHandle::from_bytes(&encode(&Spec {
        base_offset: (2 << 20) - 16,
        ..spec()
    }));
    assert!(
        matches!(past, Err(Error::IpcHandleSpan { lo, hi, size }) if lo == (2 << 20) - 16 && hi == (2 << 20) - 16 + 48 && size == 2 << 20),
        "{past:?}"
    );
    let before = IpcHandle::from_bytes(&encode(&Spec {
        base_offset: 8,
        strides: vec![-4, 1],
        ..spec()
    }));
    assert!(
        matches!(before, Err(Error::IpcHandleSpan { lo: -24, .. })),
        "{before:?}"
    );
    // The core refuses bad layouts and dtypes.
    assert!(matches!(
        IpcHandle::from_bytes(&encode(&Spec {
            dtype: (99, 32, 1),
            ..spec()
        })),
        Err(Error::IpcHandleField {
            value: 0x6320_0001,
            ..
        })
    ));
    assert!(matches!(
        IpcHandle::from_bytes(&encode(&Spec {
            shape: vec![-3, 4],
            ..spec()
        })),
        Err(Error::Core(_))
    ));
    assert!(matches!(
        IpcHandle::from_bytes(&encode(&Spec {
            base_offset: 1026,
            ..spec()
        })),
        Err(Error::Core(tensorbridge_core::Error::Misaligned { .. }))
    ));
    // A rank above 64.
    let deep = Spec {
        shape: vec![1; 65],
        strides: vec![1; 65],
        ..spec()
    };
    assert!(matches!(
        IpcHandle::from_bytes(&encode(&deep)),
        Err(Error::IpcHandleField {
            field: "rank",
            value: 65,
            ..
        })
    ));
    // A declared length that disagrees with the rank.
    let mut b = encode_declared(&spec(), Some(248 + 16 * 3));
    b.extend_from_slice(&[0; 16]);
    reseal(&mut b);
    assert!(matches!(
        IpcHandle::from_bytes(&b),
        Err(Error::IpcHandleLength { .. })
    ));
}

#[test]
fn without_a_driver_export_and_import_say_so() {
    if tensorbridge_cuda::driver_present() {
        return;
    }
    let host = tensorbridge_core::Tensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
    assert!(matches!(
        ipc::export(&host, 1),
        Err(Error::IpcNotDevice { device }) if device == Device::CPU
    ));
    // A CUDA tensor (over host memory: nothing reads it without a driver).
    let desc = Descriptor::new(
        host.data_ptr(),
        Device::cuda(0),
        DType::FLOAT32,
        Packing::Packed,
        Layout::row_major(&[4]).unwrap(),
        Access::ReadOnly,
    )
    .unwrap();
    // SAFETY: the span is `host`'s four floats, kept alive by its owner; nothing reads or
    // writes them here (there is no driver to hand them to).
    let cuda = unsafe { tensorbridge_core::Tensor::from_descriptor(desc, host.owner().clone()) };
    assert!(matches!(ipc::export(&cuda, 1), Err(Error::NoDriver)));
    assert!(matches!(
        ipc::export(&cuda, 1 << 23),
        Err(Error::IpcHandleField {
            field: "consumer count",
            ..
        })
    ));
    let h = IpcHandle::from_bytes(&encode(&spec())).unwrap();
    // SAFETY: the legacy default stream is always live; without a driver nothing runs.
    let r = unsafe { ipc::import_raw(&h, Stream::LegacyDefault) };
    assert!(matches!(r, Err(Error::NoDriver)), "{r:?}");
    assert!(matches!(ipc::device_uuid(0), Err(Error::NoDriver)));
    assert_eq!(ipc::collect(), 0);
    assert!(ipc::reports().is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = IpcHandle::from_bytes(&bytes);
        let mut with_magic = b"TBSHARE\0".to_vec();
        with_magic.extend_from_slice(&bytes);
        let _ = IpcHandle::from_bytes(&with_magic);
    }

    /// A valid handle with up to 8 bytes overwritten: refused (the checksum), and, with the
    /// checksum recomputed, decoded or refused, never a panic; whatever decodes lies inside
    /// its allocation.
    #[test]
    fn altered_handles_never_panic(
        edits in proptest::collection::vec((0usize..400, any::<u8>()), 1..8),
        ndim in 0usize..5,
    ) {
        let base = Spec {
            shape: vec![2; ndim],
            strides: (0..ndim).rev().map(|i| 1i64 << i).collect(),
            ..spec()
        };
        let bytes = encode(&base);
        let mut b = bytes.clone();
        for (i, v) in &edits {
            let i = i % b.len();
            b[i] = *v;
        }
        if b != bytes {
            prop_assert!(IpcHandle::from_bytes(&b).is_err());
        }
        reseal(&mut b);
        if let Ok(h) = IpcHandle::from_bytes(&b) {
            prop_assert!(h.allocation_size() > 0 || h.shape().contains(&0));
            prop_assert_eq!(h.as_bytes(), &b[..]);
        }
    }

    /// The encoder here and the decoder agree on every rank and layout that fits.
    #[test]
    fn documented_encoding_roundtrips(
        shape in proptest::collection::vec(1i64..5, 0..6),
        readonly in any::<bool>(),
        offset in 0u64..64,
    ) {
        let mut strides = vec![0i64; shape.len()];
        let mut acc = 1;
        for i in (0..shape.len()).rev() {
            strides[i] = acc;
            acc *= shape[i];
        }
        let s = Spec {
            flags: u32::from(readonly) | 0b10,
            base_offset: offset * 4,
            shape: shape.clone(),
            strides: strides.clone(),
            ..spec()
        };
        let h = IpcHandle::from_bytes(&encode(&s)).unwrap();
        prop_assert_eq!(h.shape(), &shape[..]);
        prop_assert_eq!(h.strides_elems(), &strides[..]);
        prop_assert_eq!(h.is_readonly(), readonly);
    }
}
