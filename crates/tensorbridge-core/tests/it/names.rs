//! Names users type for dtypes and devices, printed and parsed.

use proptest::prelude::*;
use tensorbridge_core::{DType, Device, DeviceType};
use tensorbridge_testkit::{device_code, dtype};

/// Arbitrary short strings, biased towards the characters names are made of. Built from
/// chars rather than a regex strategy: compiling a Unicode regex takes minutes under Miri.
fn text(max: usize) -> impl Strategy<Value = String> {
    let ch = prop_oneof![
        3 => proptest::sample::select("abcdefilnortux0123456789_:".chars().collect::<Vec<_>>()),
        1 => any::<char>(),
    ];
    proptest::collection::vec(ch, 0..=max).prop_map(String::from_iter)
}

proptest! {
    #![proptest_config(crate::config())]

    #[test]
    fn dtype_name_roundtrip(dt in dtype()) {
        let name = dt.to_string();
        prop_assert_eq!(name.parse::<DType>().unwrap(), dt);
    }

    #[test]
    fn dtype_parse_never_panics(s in text(24)) {
        // Any accepted name prints back to a name that parses to the same dtype.
        if let Ok(dt) = s.parse::<DType>() {
            prop_assert_eq!(dt.to_string().parse::<DType>().unwrap(), dt);
        }
    }

    #[test]
    fn device_name_roundtrip(code in device_code(), ordinal in 0u32..1000) {
        let dev = Device::new(DeviceType::from_code(code).unwrap(), ordinal);
        prop_assert_eq!(dev.to_string().parse::<Device>().unwrap(), dev);
    }

    #[test]
    fn device_parse_never_panics(s in text(16)) {
        if let Ok(dev) = s.parse::<Device>() {
            prop_assert_eq!(dev.to_string().parse::<Device>().unwrap(), dev);
        }
    }
}
