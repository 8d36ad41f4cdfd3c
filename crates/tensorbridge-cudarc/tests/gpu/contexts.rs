//! The caller's current context is left alone: every public call of this adapter, made with
//! a context of the test's own current (not a primary context, as a second GPU's would be for
//! device-0 work), and with none current, leaves exactly that current. (The CUDA layer's
//! calls: its own suite.) On one GPU this is how a multi-GPU caller's state is checked: the
//! calls bind device 0's primary context for their work, which is "another device's" context
//! here.

use std::ptr::null_mut;

use anyhow::{Result, ensure};
use cudarc::driver::sys;
use tensorbridge_cudarc as tbc;

use crate::{Kernels, affine, context, serial};

/// The calling thread's current context.
fn current() -> sys::CUcontext {
    let mut ctx = null_mut();
    // SAFETY: libcuda is loaded (a context exists); one handle written to a live local.
    let rc = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
    ctx
}

/// Makes `ctx` (or none) current.
fn set_current(ctx: sys::CUcontext) {
    // SAFETY: `ctx` is null or a context the test created and has not destroyed.
    let rc = unsafe { sys::cuCtxSetCurrent(ctx) };
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
}

/// A context of the test's own on device 0 (`cuCtxCreate`), not its primary context.
struct OwnContext(sys::CUcontext);

impl OwnContext {
    fn new() -> Result<OwnContext> {
        let mut ctx = null_mut();
        // SAFETY: device 0 exists (a primary context was made first); default parameters.
        let rc = unsafe { sys::cuCtxCreate_v4(&mut ctx, null_mut(), 0, 0) };
        ensure!(rc == sys::CUresult::CUDA_SUCCESS, "cuCtxCreate: {rc:?}");
        // cuCtxCreate makes it current; the test sets what it wants itself.
        Ok(OwnContext(ctx))
    }
}

impl Drop for OwnContext {
    fn drop(&mut self) {
        // SAFETY: created above, destroyed once.
        unsafe { sys::cuCtxDestroy_v2(self.0) };
    }
}

const NOP: &str = r#"extern "C" __global__ void nop(float* x) { }"#;
static NOP_KERNEL: tbc::Kernel = tbc::Kernel::new(NOP, "nop");

#[test]
fn public_calls_leave_the_callers_current_context_as_they_found_it() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let _k = Kernels::load(&ctx)?;
    let producer = ctx.new_stream()?;
    let consumer = ctx.new_stream()?;
    let own = OwnContext::new()?;
    for (what, state) in [("a non-primary context", own.0), ("no context", null_mut())] {
        // cudarc calls bind their own context: made before the state under test is set.
        let tensor = tbc::import(producer.clone_htod(&affine(1024, 1.0, 0.0))?)?;
        let spare = producer.clone_htod(&affine(256, 1.0, 0.0))?;
        let mut lent = producer.clone_htod(&affine(256, 1.0, 0.0))?;
        let spare_tensor = tbc::import(spare)?;
        set_current(state);
        let check = |call: &str| {
            assert_eq!(
                current(),
                state,
                "{call} changed the current context (it was {what})"
            );
        };
        drop(tbc::view::<f32>(&tensor, &consumer)?);
        check("view and its drop (retire_on)");
        {
            let args = tbc::KernelArgs::new(&consumer);
            drop(args.input::<f32>(&tensor)?);
            // SAFETY: the view is dropped at once and no launch uses it.
            drop(args.input::<f32>(unsafe { tbc::KernelTensor::borrowed(tensor.as_ref()) })?);
        }
        check("KernelArgs::input (owned and borrowed)");
        drop(tbc::kernel(&consumer, NOP, "nop")?);
        check("kernel (compile and load)");
        drop(tbc::kernel(&consumer, NOP, "nop")?);
        check("kernel (cached)");
        drop(NOP_KERNEL.function(&consumer)?);
        check("Kernel::function");
        tbc::lend(&mut lent, |l| {
            drop(l.view_mut(&consumer)?);
            Ok::<_, tbc::Error>(())
        })?;
        check("lend (and its end)");
        let back =
            tbc::try_into_slice::<f32>(spare_tensor).map_err(|_| anyhow::anyhow!("taken"))?;
        check("try_into_slice");
        set_current(null_mut());
        drop(back);
        set_current(state);
        drop(tensor);
        check("dropping tensors");
        let again = tbc::import(lent).map_err(|e| anyhow::anyhow!("{e}"))?;
        check("import");
        drop(again);
    }
    set_current(null_mut());
    Ok(())
}
