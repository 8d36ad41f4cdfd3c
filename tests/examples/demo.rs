//! The main job: hand one buffer through every path tensorbridge knows and print a table of
//! what was shared zero-copy and what each conversion costs. Run it with `cargo xtask demo`
//! (release, with libtorch from the managed environment). It needs no GPU, CUDA or Python:
//! the cudarc row says it was skipped where there is no GPU, and the libtorch row where the
//! demo was built without the `tch` feature.
//!
//! Each path is one [`Path`] in [`PATHS`]: a producer, a consumer, and a function that makes
//! its own buffer, converts it, and reports a [`Measured`] outcome (or why it was skipped,
//! for example "no GPU"). An adapter joins the table with one function and one entry, behind
//! its feature where it has one. Zero-copy is checked two ways: the consumer's data pointer
//! is the producer's, and a write through the consumer is visible through the producer.

use std::hint::black_box;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use tensorbridge_core::{DType, Owner, RawTensor, Tensor};
use tensorbridge_integration::f32_pattern;

/// One row of the table.
struct Path {
    producer: &'static str,
    consumer: &'static str,
    run: fn() -> Result<Outcome>,
}

/// Every path, in table order. DLPack, the CUDA Array Interface, cudarc, libtorch and the
/// Python frameworks add theirs here.
const PATHS: &[Path] = &[
    Path {
        producer: "host buffer (Arc owner)",
        consumer: "tensorbridge_core::Tensor",
        run: host_buffer_to_tensor,
    },
    Path {
        producer: "tensorbridge_core::Tensor",
        consumer: "DLPack 1.3 -> tensorbridge_core::Tensor",
        run: tensor_through_dlpack,
    },
    Path {
        producer: "tensorbridge_core::Tensor",
        consumer: "__array_interface__ v3 -> tensorbridge_core::Tensor",
        run: tensor_through_array_interface,
    },
    Path {
        producer: "tensorbridge_core::Tensor",
        consumer: "libtorch (tch::Tensor) -> tensorbridge_core::Tensor",
        run: tensor_through_libtorch,
    },
    Path {
        producer: "ndarray Array2 (lent)",
        consumer: "tensorbridge_core::Tensor -> ndarray ArrayView",
        run: ndarray_through_tensor,
    },
    Path {
        producer: "candle Tensor (CPU)",
        consumer: "tensorbridge_core::Tensor -> candle Tensor",
        run: candle_through_tensor,
    },
    Path {
        producer: "tensorbridge_core::Tensor",
        consumer: "burn-flex Tensor -> tensorbridge_core::Tensor",
        run: tensor_through_burn,
    },
    Path {
        producer: "cudarc CudaSlice (GPU)",
        consumer: "tensorbridge_core::Tensor -> cudarc kernel argument",
        run: cudarc_slice_to_kernel_argument,
    },
];

/// What one path did.
enum Outcome {
    Measured(Measured),
    /// The path cannot run on this machine; the reason is printed under the table.
    Skipped(String),
}

/// The result of a conversion that ran.
struct Measured {
    /// The consumer's data pointer equals the producer's.
    same_pointer: bool,
    /// A write through the consumer is visible through the producer's pointer.
    write_visible: bool,
    /// Median time of one conversion (validation, owner attached, result dropped).
    per_conversion: Duration,
}

fn main() -> Result<()> {
    println!("tensorbridge demo: one 2x3 float32 buffer through every Rust path\n");
    let mut table = Table::new([
        "producer",
        "consumer",
        "zero-copy (pointer)",
        "zero-copy (write)",
        "time per conversion",
    ]);
    let mut notes = Vec::new();
    let mut failed = 0;
    for path in PATHS {
        let mut note = |text: String| {
            notes.push(text);
            format!("[{}]", notes.len())
        };
        let [pointer, write, time] = match (path.run)() {
            Ok(Outcome::Measured(m)) => {
                if !(m.same_pointer && m.write_visible) {
                    failed += 1;
                }
                [
                    yes_no(m.same_pointer),
                    yes_no(m.write_visible),
                    format_duration(m.per_conversion),
                ]
            }
            Ok(Outcome::Skipped(why)) => {
                let mark = note(format!("skipped: {why}"));
                [format!("skipped {mark}"), "-".into(), "-".into()]
            }
            Err(e) => {
                failed += 1;
                let mark = note(format!("error: {e:#}"));
                [format!("error {mark}"), "-".into(), "-".into()]
            }
        };
        table.row([
            path.producer.into(),
            path.consumer.into(),
            pointer,
            write,
            time,
        ]);
    }
    table.print();
    for (i, text) in notes.iter().enumerate() {
        println!("[{}] {text}", i + 1);
    }
    if failed > 0 {
        bail!("{failed} path(s) failed or copied where zero-copy was expected");
    }
    Ok(())
}

/// Host memory in a `Vec`, described through the core's raw descriptor.
fn host_buffer_to_tensor() -> Result<Outcome> {
    let buffer = Arc::new(HostBuffer::new(f32_pattern(6)));
    let tensor = describe(&buffer)?;
    let same_pointer = tensor.data_ptr() == buffer.addr();
    let write_visible = write_is_visible(&tensor, &buffer)?;
    drop(tensor);

    let per_conversion = median_time(|| describe(black_box(&buffer)).map(drop))?;
    Ok(Outcome::Measured(Measured {
        same_pointer,
        write_visible,
        per_conversion,
    }))
}

/// A tensor exported as a versioned DLPack managed tensor and imported back: what any DLPack
/// consumer receives, and the deleter chain that keeps the buffer alive.
fn tensor_through_dlpack() -> Result<Outcome> {
    through_consumer(dlpack_roundtrip)
}

/// A tensor described as NumPy's `__array_interface__` (what the Python layer turns into a
/// dict) and read back; the interface carries no owner, so the buffer's owner is passed on.
fn tensor_through_array_interface() -> Result<Outcome> {
    through_consumer(array_interface_roundtrip)
}

/// A tensor handed to libtorch (tch, with a real deleter) and back: libtorch's CPU tensor
/// shares the buffer, and the owner chain keeps it alive after the producer's tensor is gone.
#[cfg(feature = "tch")]
fn tensor_through_libtorch() -> Result<Outcome> {
    through_consumer(|t| {
        // SAFETY: no view of the tensor lives while libtorch writes it.
        let torch = unsafe { tensorbridge_tch::export(t) }?;
        // SAFETY: a storage `tensorbridge_tch::export` made, which libtorch refuses to resize;
        // `torch` never leaves this thread.
        Ok(unsafe { tensorbridge_tch::import(&torch) }?)
    })
}

#[cfg(not(feature = "tch"))]
fn tensor_through_libtorch() -> Result<Outcome> {
    Ok(Outcome::Skipped(
        "built without libtorch (the `tch` feature, which `cargo xtask demo` turns on with its \
         environment's libtorch)"
            .to_owned(),
    ))
}

/// An ndarray array lent as a tensor and viewed back as an ndarray view: the view's element
/// 0 is the array's; a write through a writable view of an imported (owned) array is what
/// the array holds when it comes back. The time is one lend plus one view.
fn ndarray_through_tensor() -> Result<Outcome> {
    use ndarray::{Array2, Ix2};
    let array = Array2::from_shape_vec((2, 3), f32_pattern(6))?;
    let ptr = array.as_ptr() as usize;
    let lent_view = |a: &Array2<f32>| {
        tensorbridge_ndarray::lend(a, |lent| {
            let v = tensorbridge_ndarray::view_ref::<f32, Ix2>(lent.as_ref())?;
            Ok::<_, tensorbridge_ndarray::Error>(v.as_ptr() as usize)
        })
    };
    let same_pointer = lent_view(&array)? == ptr;
    let before = array[[1, 2]];
    let tensor = tensorbridge_ndarray::import(array).map_err(|e| anyhow::anyhow!("{e}"))?;
    {
        // SAFETY: the only view of the tensor, which no one else holds.
        let mut v = unsafe { tensorbridge_ndarray::view_mut::<f32, Ix2>(&tensor) }?;
        v[[1, 2]] = -before;
    }
    let Ok(back) = tensorbridge_ndarray::try_into_array::<f32, Ix2>(tensor) else {
        bail!("the imported array did not come back");
    };
    let write_visible = back[[1, 2]] == -before && back.as_ptr() as usize == ptr;
    let per_conversion = median_time(|| lent_view(black_box(&back)).map(drop).map_err(Into::into))?;
    Ok(Outcome::Measured(Measured {
        same_pointer,
        write_visible,
        per_conversion,
    }))
}

/// A candle CPU tensor imported as a tensor (its storage shared, the candle tensor the
/// owner) and exported back (the same candle tensor): a write through the tensor is what
/// candle reads. The time is one import plus one export.
fn candle_through_tensor() -> Result<Outcome> {
    let c = candle_core::Tensor::from_vec(f32_pattern(6), (2, 3), &candle_core::Device::Cpu)?;
    let storage_addr = {
        let (storage, _) = c.storage_and_layout();
        match &*storage {
            candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)) => v.as_ptr() as usize,
            _ => bail!("a CPU float32 storage"),
        }
    };
    let roundtrip = |c: &candle_core::Tensor| -> Result<candle_core::Tensor> {
        // SAFETY: candle writes `c` in place nowhere in the demo.
        let t = unsafe { tensorbridge_candle::import(c) }?;
        Ok(tensorbridge_candle::export(&t)?)
    };
    // SAFETY: as above.
    let tensor = unsafe { tensorbridge_candle::import(&c) }?;
    let same_pointer = tensor.data_ptr() == storage_addr && roundtrip(&c)?.id() == c.id();
    let before = {
        // SAFETY: the only view of the memory while it lives; candle reads it only after.
        let mut view = unsafe { tensor.host_view_mut::<f32>() }?;
        let before = view.get(&[1, 2])?;
        view.set(&[1, 2], -before)?;
        before
    };
    let write_visible = c.to_vec2::<f32>()?[1][2] == -before;
    drop(tensor);
    let per_conversion = median_time(|| roundtrip(black_box(&c)).map(drop))?;
    Ok(Outcome::Measured(Measured {
        same_pointer,
        write_visible,
        per_conversion,
    }))
}

/// A tensor handed to burn's CPU backend (burn's storage over the tensor's memory, the tensor
/// held by burn's byte controller) and back (a burn tensor out, read-only): the same
/// memory, and a write through the producer's buffer is what the round trip reads.
fn tensor_through_burn() -> Result<Outcome> {
    through_consumer_read_only(|t| {
        let b: burn_tensor::Tensor<2> = tensorbridge_burn::export(t)?;
        Ok(tensorbridge_burn::import(b)?)
    })
}

/// [`through_consumer`] for consumers that give back a read-only tensor: the write goes
/// through the producer's tensor and must be what the consumer's tensor reads.
fn through_consumer_read_only(convert: fn(&Tensor) -> Result<Tensor>) -> Result<Outcome> {
    let buffer = Arc::new(HostBuffer::new(f32_pattern(6)));
    let tensor = describe(&buffer)?;
    let through = convert(&tensor)?;
    let same_pointer = through.data_ptr() == buffer.addr();
    let before = through.host_view::<f32>()?.get(&[1, 2])?;
    {
        // SAFETY: obligation 1: the only view of the buffer while it lives; `through` is read
        // only after this block.
        let mut view = unsafe { tensor.host_view_mut::<f32>() }?;
        view.set(&[1, 2], -before)?;
    }
    let write_visible = through.host_view::<f32>()?.get(&[1, 2])? == -before;
    drop(through);
    let per_conversion = median_time(|| convert(black_box(&tensor)).map(drop))?;
    Ok(Outcome::Measured(Measured {
        same_pointer,
        write_visible,
        per_conversion,
    }))
}

/// A cudarc slice imported as a tensor, then viewed as a cudarc kernel argument on another
/// stream: the view's device address is the slice's, and bytes written through that address
/// are what the slice reads back. Skipped (with the reason) without a GPU.
fn cudarc_slice_to_kernel_argument() -> Result<Outcome> {
    use cudarc::driver::{DevicePtr, sys};
    if !tensorbridge_cuda::driver_present() {
        return Ok(Outcome::Skipped(
            "no CUDA driver on this machine (the GPU rows need an NVIDIA GPU)".to_owned(),
        ));
    }
    let _keep = tensorbridge_cuda::ContextGuard::save()?;
    let ctx = match tensorbridge_cuda::primary_context(0) {
        Ok(ctx) => ctx,
        Err(e) => return Ok(Outcome::Skipped(format!("no usable CUDA device: {e}"))),
    };
    let producer = ctx.new_stream()?;
    let consumer = ctx.new_stream()?;
    let slice = producer.clone_htod(&f32_pattern(6))?;
    let base = {
        let (ptr, _record) = slice.device_ptr(&producer);
        ptr
    };
    let tensor = tensorbridge_cudarc::import(slice).map_err(|e| anyhow::anyhow!("{e}"))?;
    let view = tensorbridge_cudarc::view::<f32>(&tensor, &consumer)?;
    let same_pointer = view.device_ptr() == base;
    // A write through the consumer's address, on the consumer's stream (ordered after the
    // producer by the view), read back through the producer's slice.
    let marker = [-7.5f32];
    ctx.bind_to_thread()?;
    // SAFETY: the view's address holds 6 floats kept alive by `tensor`; one float is written
    // from a live local, synchronously on the consumer stream.
    let rc = unsafe {
        sys::cuMemcpyHtoDAsync_v2(
            view.device_ptr(),
            marker.as_ptr().cast(),
            size_of::<f32>(),
            consumer.cu_stream(),
        )
    };
    if rc != sys::CUresult::CUDA_SUCCESS {
        bail!("cuMemcpyHtoDAsync failed with {rc:?}");
    }
    consumer.synchronize()?;
    drop(view);
    let slice = tensorbridge_cudarc::try_into_slice::<f32>(tensor)
        .map_err(|_| anyhow::anyhow!("the slice did not come back"))?;
    let write_visible = producer.clone_dtoh(&slice)?[0] == marker[0];
    let tensor = tensorbridge_cudarc::import(slice).map_err(|e| anyhow::anyhow!("{e}"))?;
    let per_conversion = median_time(|| {
        tensorbridge_cudarc::view::<f32>(black_box(&tensor), &consumer)?;
        Ok(())
    })?;
    Ok(Outcome::Measured(Measured {
        same_pointer,
        write_visible,
        per_conversion,
    }))
}

/// Hands a tensor over a buffer to a consumer (`convert`) and checks zero-copy: the
/// consumer's pointer is the buffer's, and a write through the consumer, made after the
/// producer's tensor is dropped (only the consumer's chain keeps the buffer alive then), is
/// visible in the buffer. Then times `convert`.
fn through_consumer(convert: fn(&Tensor) -> Result<Tensor>) -> Result<Outcome> {
    let buffer = Arc::new(HostBuffer::new(f32_pattern(6)));
    let tensor = describe(&buffer)?;
    let through = convert(&tensor)?;
    drop(tensor);
    let same_pointer = through.data_ptr() == buffer.addr();
    let write_visible = write_is_visible(&through, &buffer)?;
    drop(through);
    let tensor = describe(&buffer)?;
    let per_conversion = median_time(|| convert(black_box(&tensor)).map(drop))?;
    Ok(Outcome::Measured(Measured {
        same_pointer,
        write_visible,
        per_conversion,
    }))
}

/// Negates element [1, 2] through a writable view of `tensor` and reports whether the
/// buffer's own element 5 (the same bytes in C order) changed accordingly.
fn write_is_visible(tensor: &Tensor, buffer: &HostBuffer) -> Result<bool> {
    let before = {
        // SAFETY: obligation 1: the view is the only reader or writer of the buffer while it
        // lives: the demo has one thread, callers hold no other view, and the buffer is read
        // only after this block drops the view.
        let mut view = unsafe { tensor.host_view_mut::<f32>() }?;
        let before = view.get(&[1, 2])?;
        view.set(&[1, 2], -before)?;
        before
    };
    Ok(buffer.read(5) == -before)
}

/// The conversion being timed: export the interface, validate it, attach the owner.
fn array_interface_roundtrip(tensor: &Tensor) -> Result<Tensor> {
    let interface = tensorbridge_cai::ArrayInterface::export(tensor)?;
    let validated = interface.import(&tensorbridge_cai::ImportOptions::new())?;
    // SAFETY:
    // 1, 2: the interface describes `tensor`'s own memory, which the owner passed on keeps
    //    alive and writable, and `tensor`'s contract (see `describe`) already excludes
    //    racing readers and writers;
    // 3, 4: the array interface carries no stream: the readiness is `Now`, and nothing is
    //    pending on host memory.
    Ok(unsafe { validated.into_tensor(tensor.owner().clone()) })
}

/// The conversion being timed: export to DLPack 1.3, hand the raw struct over, import it.
fn dlpack_roundtrip(tensor: &Tensor) -> Result<Tensor> {
    let raw = tensorbridge_dlpack::export_versioned(tensor)?.into_raw();
    let Some(raw) = std::ptr::NonNull::new(raw) else {
        bail!("export returned a null managed tensor");
    };
    // SAFETY: a live managed tensor just exported by tensorbridge-dlpack, whose owner clone
    // keeps the buffer alive; ownership passes to the import and `raw` is not used again.
    let imported = unsafe { tensorbridge_dlpack::import_versioned(raw) }?;
    Ok(imported.into_tensor())
}

/// The conversion being timed: `buffer` as a 2x3 float32 tensor, through the raw descriptor,
/// with the buffer as its owner.
fn describe(buffer: &Arc<HostBuffer>) -> Result<Tensor> {
    let raw = RawTensor::host(buffer.addr(), DType::FLOAT32, &[2, 3]);
    let desc = raw.validate()?;
    if desc.byte_span() != buffer.byte_span() {
        bail!(
            "a 2x3 float32 tensor spans {:#x?}, the buffer {:#x?}",
            desc.byte_span(),
            buffer.byte_span()
        );
    }
    let owner: Owner = buffer.clone();
    // SAFETY:
    // 1. the span is exactly the buffer's elements (checked just above), which `owner` keeps
    //    allocated and writable until its last clone drops;
    // 2. the buffer is read through its pointer only while no view of the tensor lives
    //    (`HostBuffer::read` and `host_buffer_to_tensor`).
    Ok(unsafe { Tensor::from_descriptor(desc, owner) })
}

/// A host buffer shared by a producer and its consumers: owned through a raw pointer, so
/// writes through a tensor never alias a Rust reference to the elements.
struct HostBuffer {
    ptr: *mut f32,
    len: usize,
}

impl HostBuffer {
    fn new(values: Vec<f32>) -> HostBuffer {
        let len = values.len();
        let ptr = Box::into_raw(values.into_boxed_slice()).cast::<f32>();
        HostBuffer { ptr, len }
    }

    fn addr(&self) -> usize {
        self.ptr as usize
    }

    /// The addresses of the elements, `[first, end)`.
    fn byte_span(&self) -> Range<usize> {
        self.addr()..self.addr() + self.len * size_of::<f32>()
    }

    fn read(&self, i: usize) -> f32 {
        assert!(
            i < self.len,
            "index {i} out of bounds for {} elements",
            self.len
        );
        let element = self.ptr.wrapping_add(i);
        // SAFETY: in bounds (asserted) of the live allocation this buffer owns, so aligned and
        // initialised; writers go through `Tensor::host_view_mut`, whose contract excludes
        // reads while they write.
        unsafe { element.read() }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.ptr, self.len);
        // SAFETY: `ptr` and `len` come from `Box::into_raw` in `HostBuffer::new`; this is the
        // only place that turns them back, once.
        drop(unsafe { Box::from_raw(slice) });
    }
}

// SAFETY: a `Box<[f32]>` behind a raw pointer; `f32` has no thread affinity.
unsafe impl Send for HostBuffer {}
// SAFETY: sharing hands out no references to the elements, only the address.
unsafe impl Sync for HostBuffer {}

/// The median time of one call to `f`: calls are batched so that one sample lasts at least
/// ~100 µs (timer resolution stops mattering), and the median of 101 samples is taken.
fn median_time(mut f: impl FnMut() -> Result<()>) -> Result<Duration> {
    let mut batch = 1u32;
    loop {
        let start = Instant::now();
        for _ in 0..batch {
            f()?;
        }
        if start.elapsed() >= Duration::from_micros(100) || batch >= 1 << 20 {
            break;
        }
        batch *= 2;
    }
    let mut samples = Vec::with_capacity(101);
    for _ in 0..101 {
        let start = Instant::now();
        for _ in 0..batch {
            f()?;
        }
        samples.push(start.elapsed() / batch);
    }
    samples.sort();
    Ok(samples[samples.len() / 2])
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "NO" }.to_owned()
}

fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns < 10_000 {
        format!("{ns} ns")
    } else {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    }
}

/// A table printed as Markdown, columns padded to their widest cell.
struct Table<const N: usize> {
    header: [&'static str; N],
    rows: Vec<[String; N]>,
}

impl<const N: usize> Table<N> {
    fn new(header: [&'static str; N]) -> Table<N> {
        Table {
            header,
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: [String; N]) {
        self.rows.push(cells);
    }

    fn print(&self) {
        let mut widths = self.header.map(|h| h.chars().count());
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: [&str; N]| {
            let padded: Vec<String> = cells
                .iter()
                .zip(widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            println!("| {} |", padded.join(" | "));
        };
        line(self.header);
        let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
        println!("|-{}-|", rule.join("-|-"));
        for row in &self.rows {
            line(row.each_ref().map(String::as_str));
        }
    }
}
