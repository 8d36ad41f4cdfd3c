//! Kernel helpers without a GPU: NVRTC's absence is an error (cudarc would panic), the
//! kernel layout's C struct and rank limit.

use tensorbridge_cudarc::{Error, KERNEL_LAYOUT_CUDA, KernelLayout, MAX_KERNEL_RANK, ptx};

#[test]
fn nvrtc_missing_or_present_never_panics() {
    let src = "extern \"C\" __global__ void k(float* x) { x[0] = 1.0f; }";
    match ptx(src, "k") {
        Ok(p) => assert!(tensorbridge_cudarc::nvrtc_present() && p.to_src().contains(".entry k")),
        Err(e) => {
            assert!(
                !tensorbridge_cudarc::nvrtc_present(),
                "libnvrtc at {:?} failed: {e}",
                tensorbridge_cudarc::nvrtc_path()
            );
            assert!(matches!(e, Error::NoNvrtc), "{e:?}");
            assert_eq!(
                e.to_string(),
                "cannot compile CUDA kernels: libnvrtc could not be loaded (expected the CUDA toolkit's libnvrtc.so on the library path, e.g. /usr/local/cuda/lib64, or the nvidia-cuda-nvrtc wheel)"
            );
        }
    }
}

#[test]
fn kernel_layout_is_the_c_struct() {
    // 8 extents, 8 strides, rank, padding: what `tb_layout` declares.
    assert_eq!(std::mem::size_of::<KernelLayout>(), 8 * 8 * 2 + 8);
    assert_eq!(std::mem::align_of::<KernelLayout>(), 8);
    assert!(KERNEL_LAYOUT_CUDA.contains("long long shape[8];"));
    assert!(KERNEL_LAYOUT_CUDA.contains("long long strides[8];"));
    let l = KernelLayout::new(&[3, 4], &[1, 3]).unwrap();
    assert_eq!(l.rank, 2);
    assert_eq!(&l.shape[..3], &[3, 4, 1]);
    assert_eq!(&l.strides[..3], &[1, 3, 0]);
}

#[test]
fn kernel_layout_rank_limit() {
    let shape = [1i64; MAX_KERNEL_RANK + 1];
    let err = KernelLayout::new(&shape, &shape).unwrap_err();
    assert!(
        matches!(err, Error::RankTooLarge { rank: 9, max: 8 }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "the tensor has 9 dimensions but a kernel layout holds at most 8 (expected a tensor of rank <= 8; reshape or make it contiguous and flatten it)"
    );
    assert!(KernelLayout::new(&shape[..8], &shape[..8]).is_ok());
    // Strides of another length: refused, not filled with zeros (a broadcast the tensor is
    // not) or cut short.
    assert!(matches!(
        KernelLayout::new(&[3, 4], &[1]),
        Err(Error::Core(tensorbridge_core::Error::RankMismatch {
            shape: 2,
            strides: 1
        }))
    ));
    assert!(KernelLayout::new(&[3], &[1, 3]).is_err());
}

#[test]
fn driver_errors_convert_with_question_mark() {
    fn f() -> Result<(), Error> {
        Err(cudarc::driver::DriverError(
            cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE,
        ))?;
        Ok(())
    }
    let e = f().unwrap_err();
    assert!(
        matches!(
            e,
            Error::Cuda(tensorbridge_cuda::Error::Driver {
                call: "(a cudarc call)",
                ..
            })
        ),
        "{e:?}"
    );
}

/// Where libnvrtc is found (in CI: the managed venv's wheel, through `$VIRTUAL_ENV`), its
/// options take effect: `-D` defines reach the source, a real architecture gives a CUBIN
/// (an ELF image) instead of PTX text, and errors carry NVRTC's log.
#[test]
fn nvrtc_options_take_effect_where_nvrtc_is_found() {
    use tensorbridge_cudarc::{Arch, CompileOptions, ptx_with};
    if !tensorbridge_cudarc::nvrtc_present() {
        println!("no libnvrtc here: covered where one is found");
        return;
    }
    println!(
        "libnvrtc: {:?}, version {:?}",
        tensorbridge_cudarc::nvrtc_path(),
        tensorbridge_cudarc::nvrtc_version()
    );
    let src = "#ifndef WANTED\n#error WANTED is not defined\n#endif\n\
               extern \"C\" __global__ void k(float* x) { x[0] = WANTED; }";
    let refused = ptx_with(src, "k", &CompileOptions::new()).unwrap_err();
    assert!(
        matches!(&refused, Error::Compile { log, .. } if log.contains("WANTED is not defined")),
        "{refused}"
    );
    let text = ptx_with(src, "k", &CompileOptions::new().define("WANTED", "2.5f")).unwrap();
    assert!(text.to_src().contains(".entry k"));
    let cubin = ptx_with(
        src,
        "k",
        &CompileOptions::new()
            .define("WANTED", "2.5f")
            .arch(Arch::Named("sm_80".into())),
    )
    .unwrap();
    // cudarc's `Ptx` shows a binary image only through `Debug`: an ELF file (0x7f 'E' 'L' 'F').
    let shown = format!("{cubin:?}");
    assert!(
        shown.contains("Binary([127, 69, 76, 70,"),
        "{}",
        &shown[..shown.len().min(80)]
    );
}

/// A kernel with options is a `static`: `Kernel::with_options` and the options' `const`
/// builders compile in a `static`'s initializer (this test does not build otherwise), and
/// the options read back as they were given, run-time items after the `const` lists.
#[test]
fn a_static_kernel_takes_options() {
    use tensorbridge_cudarc::{Arch, CompileOptions, Kernel};
    static SCALE: Kernel = Kernel::with_options(
        "extern \"C\" __global__ void scale(T* x) { x[0] *= FACTOR; }",
        "scale",
        CompileOptions::for_arch(Arch::named("sm_90a"))
            .defines(&[("T", "float"), ("FACTOR", "2")])
            .include_paths(&["/opt/kernels"])
            .options(&["-std=c++17"])
            .fast_math(true),
    );
    assert_eq!(SCALE.name(), "scale");
    assert_eq!(
        SCALE.options().nvrtc_options(Some(90)),
        [
            "--gpu-architecture=sm_90a",
            "-DT=float",
            "-DFACTOR=2",
            "--include-path=/opt/kernels",
            "--use_fast_math",
            "-std=c++17",
        ]
    );
    let both = SCALE
        .options()
        .clone()
        .define("EXTRA", "")
        .option("-lineinfo");
    assert_eq!(
        both.nvrtc_options(None),
        [
            "--gpu-architecture=sm_90a",
            "-DT=float",
            "-DFACTOR=2",
            "-DEXTRA",
            "--include-path=/opt/kernels",
            "--use_fast_math",
            "-std=c++17",
            "-lineinfo",
        ]
    );
    // Part of the cache key: a kernel with other options is another kernel.
    assert_ne!(both, *SCALE.options());
    // Where NVRTC is present, the options reach it (the defines make the source compile).
    if tensorbridge_cudarc::nvrtc_present() {
        let ptx = tensorbridge_cudarc::ptx_with(
            "extern \"C\" __global__ void scale(T* x) { x[0] *= FACTOR; }",
            "scale",
            &CompileOptions::new()
                .defines(&[("T", "float"), ("FACTOR", "2")])
                .arch(Arch::NvrtcDefault),
        )
        .unwrap();
        assert!(ptx.to_src().contains(".entry scale"));
    }
}
