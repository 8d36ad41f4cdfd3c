//! Zero-copy in both directions, proven twice: the same address, and a write through one
//! side read through the other.

use tch::{Device as TchDevice, Kind};
use tensorbridge_core::{Device, Ready, Tensor};

use crate::{import, torch_values};

#[test]
fn export_shares_memory_both_ways() {
    let t = Tensor::from_vec((0..12).map(|i| i as f32).collect(), &[3, 4]).unwrap();
    // SAFETY: no view of the tensor lives while libtorch writes it.
    let mut torch = unsafe { tensorbridge_tch::export(&t) }.unwrap();
    assert_eq!(torch.data_ptr() as usize, t.data_ptr());
    assert_eq!(torch.device(), TchDevice::Cpu);
    assert_eq!(torch.kind(), Kind::Float);
    assert_eq!((torch.size(), torch.stride()), (vec![3, 4], vec![4, 1]));

    // libtorch writes; the core tensor sees it.
    let _ = torch.narrow(0, 1, 1).fill_(-1.0);
    {
        let view = t.host_view::<f32>().unwrap();
        assert_eq!(view.get(&[1, 0]).unwrap(), -1.0);
        assert_eq!(view.get(&[2, 3]).unwrap(), 11.0);
    }

    // The core writes; libtorch sees it.
    {
        // SAFETY: nothing else reads or writes the buffer while the view lives (libtorch is
        // idle on this thread).
        let mut w = unsafe { t.host_view_mut::<f32>() }.unwrap();
        w.set(&[0, 3], 42.0).unwrap();
    }
    let _ = torch.g_mul_scalar_(2.0);
    assert_eq!(torch_values(&torch)[3], 84.0);
    assert_eq!(t.host_view::<f32>().unwrap().get(&[0, 3]).unwrap(), 84.0);
}

#[test]
fn import_shares_memory_both_ways() {
    let mut torch = tch::Tensor::zeros([2, 5], (Kind::Double, TchDevice::Cpu));
    let shared = import(&torch).unwrap();
    assert_eq!(shared.data_ptr(), torch.data_ptr() as usize);
    assert_eq!(shared.device(), Device::CPU);
    assert!(matches!(shared.ready(), Ready::Now));
    assert!(!shared.is_readonly());

    let _ = torch.fill_(3.5);
    assert!(shared.host_view::<f64>().unwrap().iter().all(|v| v == 3.5));
    {
        // SAFETY: nothing else reads or writes the storage while the view lives.
        let mut w = unsafe { shared.host_view_mut::<f64>() }.unwrap();
        w.set(&[1, 4], 7.0).unwrap();
    }
    assert_eq!(torch.double_value(&[1, 4]), 7.0);
}

#[test]
fn offsets_survive_both_ways() {
    // A core tensor whose element 0 lies 8 bytes into its buffer.
    let base = Tensor::from_vec((0..8).collect::<Vec<i32>>(), &[8]).unwrap();
    let raw = tensorbridge_core::RawTensor {
        byte_offset: 8,
        ..tensorbridge_core::RawTensor::host(base.data_ptr(), base.dtype(), &[3])
    };
    // SAFETY: elements 2, 3 and 4 of `base`, whose owner is shared.
    let t = unsafe { Tensor::from_descriptor(raw.validate().unwrap(), base.owner().clone()) };
    // SAFETY: no view of the tensor lives while libtorch writes it.
    let torch = unsafe { tensorbridge_tch::export(&t) }.unwrap();
    assert_eq!(torch.data_ptr() as usize, base.data_ptr() + 8); // folded into the pointer
    assert_eq!(Vec::<i32>::try_from(&torch).unwrap(), [2, 3, 4]);
    let back = import(&torch.narrow(0, 1, 2)).unwrap();
    // libtorch's storage starts at element 0 of `t`: the view's storage offset is 1.
    assert_eq!((back.data(), back.byte_offset()), (base.data_ptr() + 8, 4));
    assert_eq!(back.host_view::<i32>().unwrap().to_contiguous(), [3, 4]);
}

/// The sound way for libtorch to write in place: an exclusive tensor moves into libtorch's
/// storage, safe tch code writes it (the same memory: pointer equality), and the owner goes
/// once, when libtorch frees the storage. Shared and read-only tensors never get there.
#[test]
fn exclusive_export_is_written_in_place() {
    let counter = tensorbridge_testkit::DropCounter::new();
    let data: Vec<f32> = vec![1.0, 2.0, 3.0, 4.0];
    let ptr = data.as_ptr() as usize;
    let shape = [4i64];
    let desc = tensorbridge_core::RawTensor::host(ptr, tensorbridge_core::DType::FLOAT32, &shape)
        .validate()
        .unwrap();
    // SAFETY: the span is `data`'s, moved into the owner; reached only through the tensor.
    let t = unsafe { Tensor::from_descriptor(desc, counter.owner_with(data)) };
    let clone = t.clone();
    let t = t.into_exclusive().expect_err("a clone shares the owner");
    drop(clone);
    let only = t.into_exclusive().expect("the only holder");
    let mut torch = tensorbridge_tch::export_exclusive(only).unwrap();
    let _ = torch.g_add_scalar_(10.0);
    assert_eq!(torch.data_ptr() as usize, ptr, "written in place");
    assert_eq!(torch_values(&torch), [11.0, 12.0, 13.0, 14.0]);
    assert_eq!(counter.drops(), 0);
    drop(torch);
    assert_eq!(counter.drops(), 1);

    let ro = Tensor::from_vec(vec![1.0f32], &[1])
        .unwrap()
        .into_readonly();
    let err = tensorbridge_tch::export_exclusive(ro.into_exclusive().unwrap()).unwrap_err();
    assert!(matches!(err, tensorbridge_tch::Error::ReadOnly), "{err}");
}
