//! Devices: every DLPack device type, with an ordinal.

use std::fmt;
use std::str::FromStr;

use crate::Error;

/// Where memory lives, one variant per DLPack `DLDeviceType` (DLPack 1.3, codes 1 to 18).
///
/// Raw `i32` codes from foreign descriptors enter through [`DeviceType::from_code`], which
/// refuses codes this version does not know (5 and 6 are unassigned), with the code in the
/// error.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(i32)]
pub enum DeviceType {
    /// `kDLCPU` (1): host memory.
    Cpu = 1,
    /// `kDLCUDA` (2): CUDA device memory.
    Cuda = 2,
    /// `kDLCUDAHost` (3): pinned host memory from `cudaMallocHost`.
    CudaHost = 3,
    /// `kDLOpenCL` (4): the data pointer may be a `cl_mem` handle.
    OpenCl = 4,
    /// `kDLVulkan` (7).
    Vulkan = 7,
    /// `kDLMetal` (8).
    Metal = 8,
    /// `kDLVPI` (9): Verilog simulator buffer.
    Vpi = 9,
    /// `kDLROCM` (10): AMD ROCm device memory.
    Rocm = 10,
    /// `kDLROCMHost` (11): pinned host memory from `hipMallocHost`.
    RocmHost = 11,
    /// `kDLExtDev` (12): reserved extension device.
    ExtDev = 12,
    /// `kDLCUDAManaged` (13): `cudaMallocManaged` unified memory.
    CudaManaged = 13,
    /// `kDLOneAPI` (14): oneAPI unified shared memory.
    OneApi = 14,
    /// `kDLWebGPU` (15).
    WebGpu = 15,
    /// `kDLHexagon` (16): Qualcomm Hexagon DSP.
    Hexagon = 16,
    /// `kDLMAIA` (17): Microsoft MAIA.
    Maia = 17,
    /// `kDLTrn` (18): AWS Trainium.
    Trn = 18,
}

/// One row per device type: code, variant, the name used in `"cuda:0"`-style strings.
static DEVICES: [(i32, DeviceType, &str); 16] = [
    (1, DeviceType::Cpu, "cpu"),
    (2, DeviceType::Cuda, "cuda"),
    (3, DeviceType::CudaHost, "cuda_host"),
    (4, DeviceType::OpenCl, "opencl"),
    (7, DeviceType::Vulkan, "vulkan"),
    (8, DeviceType::Metal, "metal"),
    (9, DeviceType::Vpi, "vpi"),
    (10, DeviceType::Rocm, "rocm"),
    (11, DeviceType::RocmHost, "rocm_host"),
    (12, DeviceType::ExtDev, "ext_dev"),
    (13, DeviceType::CudaManaged, "cuda_managed"),
    (14, DeviceType::OneApi, "oneapi"),
    (15, DeviceType::WebGpu, "webgpu"),
    (16, DeviceType::Hexagon, "hexagon"),
    (17, DeviceType::Maia, "maia"),
    (18, DeviceType::Trn, "trn"),
];

/// The known device codes as ranges, for messages: `"1 to 4 or 7 to 18"`, read off
/// [`DEVICES`].
pub(crate) fn known_codes() -> String {
    crate::dtype::ranges(DEVICES.iter().map(|&(c, ..)| i64::from(c)))
}

/// `DEVICES` indexed by code (codes 0, 5 and 6 are unassigned).
static BY_CODE: [Option<DeviceType>; 19] = {
    let mut table = [None; 19];
    let mut i = 0;
    while i < DEVICES.len() {
        table[DEVICES[i].0 as usize] = Some(DEVICES[i].1);
        i += 1;
    }
    table
};

/// Names other libraries use for the same device types, accepted when parsing.
static DEVICE_ALIASES: [(&str, DeviceType); 4] = [
    ("cpu_pinned", DeviceType::CudaHost),
    ("cuda_pinned", DeviceType::CudaHost),
    ("hip", DeviceType::Rocm),
    ("gpu", DeviceType::Cuda),
];

impl DeviceType {
    /// The variant for a raw DLPack device code, or [`Error::UnknownDeviceType`].
    #[inline]
    pub fn from_code(code: i32) -> Result<Self, Error> {
        // Indexed, not searched: this runs on every import.
        usize::try_from(code)
            .ok()
            .and_then(|i| BY_CODE.get(i).copied().flatten())
            .ok_or(Error::UnknownDeviceType { code })
    }

    /// The raw DLPack code.
    #[inline]
    pub const fn code(self) -> i32 {
        self as i32
    }

    fn row(self) -> &'static (i32, DeviceType, &'static str) {
        DEVICES
            .iter()
            .find(|row| row.1 == self)
            .expect("every variant has a row in DEVICES")
    }

    /// Whether the data pointer is an address (as opposed to a handle such as OpenCL's
    /// `cl_mem`), so alignment can be checked and a byte offset folded into it.
    #[inline]
    pub fn has_addresses(self) -> bool {
        matches!(
            self,
            DeviceType::Cpu
                | DeviceType::Cuda
                | DeviceType::CudaHost
                | DeviceType::Rocm
                | DeviceType::RocmHost
                | DeviceType::CudaManaged
                | DeviceType::OneApi
        )
    }

    /// Whether plain host code may read and write the memory (CPU, and pinned host memory).
    ///
    /// Managed memory is deliberately excluded: touching it from the host while a kernel
    /// runs is undefined on devices without concurrent managed access.
    pub fn is_host_accessible(self) -> bool {
        matches!(
            self,
            DeviceType::Cpu | DeviceType::CudaHost | DeviceType::RocmHost
        )
    }

    /// Whether CUDA kernels can take the memory (device, managed and pinned host memory):
    /// the devices the CUDA Array Interface can describe.
    pub fn is_cuda_accessible(self) -> bool {
        matches!(
            self,
            DeviceType::Cuda | DeviceType::CudaManaged | DeviceType::CudaHost
        )
    }
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.row().2)
    }
}

/// A device type with its ordinal (DLPack's `DLDevice`).
///
/// The ordinal is the producer's numbering; DLPack's Python spec warns that it need not match
/// the consumer's (a CUDA consumer can recover the real device from the pointer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    /// The kind of memory.
    pub kind: DeviceType,
    /// The device ordinal; 0 for plain CPU, pinned and managed memory.
    pub ordinal: u32,
}

impl Device {
    /// Host memory, ordinal 0.
    pub const CPU: Device = Device {
        kind: DeviceType::Cpu,
        ordinal: 0,
    };

    /// CUDA device memory on device `ordinal`.
    pub const fn cuda(ordinal: u32) -> Device {
        Device {
            kind: DeviceType::Cuda,
            ordinal,
        }
    }

    /// A device from a kind and an ordinal.
    pub const fn new(kind: DeviceType, ordinal: u32) -> Device {
        Device { kind, ordinal }
    }

    /// A device from the raw fields of a DLPack `DLDevice`.
    #[inline]
    pub fn from_dlpack(device_type: i32, device_id: i32) -> Result<Device, Error> {
        let kind = DeviceType::from_code(device_type)?;
        let ordinal =
            u32::try_from(device_id).map_err(|_| Error::NegativeDeviceId { id: device_id })?;
        Ok(Device { kind, ordinal })
    }

    /// The raw `(device_type, device_id)` pair of a DLPack `DLDevice`.
    ///
    /// Fails only for ordinals above `i32::MAX`, which DLPack cannot carry.
    #[inline]
    pub fn to_dlpack(self) -> Result<(i32, i32), Error> {
        let id = i32::try_from(self.ordinal).map_err(|_| Error::OrdinalTooLarge {
            ordinal: self.ordinal,
        })?;
        Ok((self.kind.code(), id))
    }
}

/// `cpu`, `cuda:0`, `cuda_host`, `rocm:1`... The ordinal is printed unless the kind is
/// host memory with ordinal 0.
impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hostish = matches!(
            self.kind,
            DeviceType::Cpu | DeviceType::CudaHost | DeviceType::RocmHost | DeviceType::CudaManaged
        );
        if hostish && self.ordinal == 0 {
            write!(f, "{}", self.kind)
        } else {
            write!(f, "{}:{}", self.kind, self.ordinal)
        }
    }
}

impl FromStr for Device {
    type Err = Error;

    /// Parses `kind` or `kind:ordinal`, with the names [`Device`]'s `Display` prints and the
    /// aliases `cpu_pinned`, `cuda_pinned`, `hip` and `gpu`. A missing ordinal means 0.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let unknown = || Error::UnknownDeviceName { name: s.to_owned() };
        let (name, ordinal) = match s.split_once(':') {
            Some((name, ord)) => {
                if ord.is_empty() || !ord.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(unknown());
                }
                (name, ord.parse::<u32>().map_err(|_| unknown())?)
            }
            None => (s, 0),
        };
        let lower = name.to_ascii_lowercase();
        let kind = DEVICES
            .iter()
            .map(|&(_, kind, n)| (n, kind))
            .chain(DEVICE_ALIASES)
            .find(|(n, _)| *n == lower)
            .map(|(_, kind)| kind)
            .ok_or_else(unknown)?;
        Ok(Device { kind, ordinal })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_device_code_roundtrips() {
        for (code, kind, _) in DEVICES {
            assert_eq!(DeviceType::from_code(code).unwrap(), kind);
            assert_eq!(kind.code(), code);
            let dev = Device::new(kind, 3);
            assert_eq!(dev.to_string().parse::<Device>().unwrap(), dev);
            assert_eq!(Device::from_dlpack(code, 3).unwrap(), dev);
        }
        for bad in [0, 5, 6, 19, -1] {
            assert!(matches!(
                DeviceType::from_code(bad),
                Err(Error::UnknownDeviceType { code }) if code == bad
            ));
        }
    }

    #[test]
    fn device_strings() {
        assert_eq!("cuda:1".parse::<Device>().unwrap(), Device::cuda(1));
        assert_eq!("cuda".parse::<Device>().unwrap(), Device::cuda(0));
        assert_eq!("CPU".parse::<Device>().unwrap(), Device::CPU);
        assert_eq!(Device::CPU.to_string(), "cpu");
        assert_eq!(Device::cuda(0).to_string(), "cuda:0");
        assert_eq!(
            "cpu_pinned".parse::<Device>().unwrap().kind,
            DeviceType::CudaHost
        );
        for bad in ["", "cuda:", "cuda:-1", "tpu:0", "cuda:0:1", "cuda:x"] {
            assert!(
                matches!(bad.parse::<Device>(), Err(Error::UnknownDeviceName { .. })),
                "{bad}"
            );
        }
        assert!(matches!(
            Device::from_dlpack(2, -1),
            Err(Error::NegativeDeviceId { id: -1 })
        ));
    }
}
