//! The DLPack capsule names of the Python protocol: what a producer names a capsule it makes
//! (the export) and what a consumer renames it to once it took the tensor (the import).

use std::ffi::CStr;

pub(crate) const DLTENSOR: &CStr = c"dltensor";
pub(crate) const USED_DLTENSOR: &CStr = c"used_dltensor";
pub(crate) const DLTENSOR_VERSIONED: &CStr = c"dltensor_versioned";
pub(crate) const USED_DLTENSOR_VERSIONED: &CStr = c"used_dltensor_versioned";
