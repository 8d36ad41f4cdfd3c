//! Any Python object -> the core, zero-copy, through one route per type.
//!
//! # Routes
//! What an import does with an object is decided once per type ([`route::facts`]):
//!
//! | route | objects | read through | pin (what keeps the memory) |
//! |---|---|---|---|
//! | own view | `tensorbridge.View` | its tensor | the view's owner |
//! | NumPy | exactly `numpy.ndarray`, every dimension longer than 1 | the buffer protocol | the held buffer (NumPy refuses `resize` while it is exported) |
//! | PyTorch | `torch.Tensor` and subclasses that keep its protocol | the table's non-owning `DLTensor` | the tensor's storage, checked to hold the span (`torch::import`) |
//! | exchange | other types publishing a DLPack C exchange API capsule | the table's owning export | the managed tensor |
//! | general | everything else, in this order | `__dlpack__`, a DLPack capsule, `__cuda_array_interface__`, `__array_interface__`, the buffer protocol | the managed tensor; the interface's exporter (the protocols fix its memory for its life); the held buffer |
//!
//! # Invariants
//! Every route keeps these; each route's code names those it relies on, and
//! `tests/test_fast_paths.py` checks \[same\] field by field.
//! - \[owner\] the pin keeps every byte of the span valid until it is released, once;
//! - \[span\] the span is inside memory the exporter owns: a buffer a dict names is asked
//!   for C-contiguously (`PyBUF_SIMPLE`, as NumPy asks), so its `buf` and `len` are its whole
//!   extent; CUDA spans of the CUDA Array Interface are checked by the driver; an edited
//!   export of our own is checked against the extent we exported (`tensorbridge-dlpack`);
//!   anything else is the producer's description, trusted as every consumer of the protocol
//!   trusts it;
//! - \[access\] never wider than the producer allows: legacy DLPack capsules are read-only
//!   unless the producer is known to allow writes (NumPy, PyTorch, CuPy); a PyTorch tensor that
//!   requires grad is read-only; memory overlapping one of our live read-only exports comes
//!   back read-only (`tensorbridge-dlpack`); and each import says why it is read-only
//!   (`crate::floor::access`'s `Provenance`), which decides what a view of it hands out;
//! - \[ready\] the readiness names only streams that outlive the tensor: default streams,
//!   PyTorch's pool streams (never destroyed), a stream the pin keeps alive (the CUDA Array
//!   Interface's exporter's); any other stream becomes an event recorded while it is known to
//!   be alive; a caller's stream is ordered, never named;
//! - \[same\] a fast route yields the general route's pointer, shape, strides, dtype, device
//!   and access (its readiness may name another stream, never a wrong one);
//! - \[borrow\] arrays borrowed from a producer (a non-owning `DLTensor`'s shape and strides)
//!   are read after the last call that may run other threads, and used before any other;
//! - \[type\] only facts about the type are cached; facts about the object are asked per call;
//! - \[once\] a capsule is consumed at most once;
//! - \[refuse\] bad input is a typed exception; nothing panics, aborts or recurses without
//!   bound on what a producer says (`descr` is read flat).

pub(crate) mod buffer;
pub(crate) mod capsule;
pub(crate) mod dlpack;
pub(crate) mod exchange;
pub(crate) mod interfaces;
pub(crate) mod route;
pub(crate) mod shim;
pub(crate) mod torch;

use std::sync::atomic::{AtomicUsize, Ordering};

use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use tensorbridge_core::{Descriptor, Owner, Ready, Stream, Tensor};

use crate::convert::type_name;
use crate::error::{Error, Result};
use crate::floor::access::Provenance;
use crate::floor::view::View;
use crate::owner::KeepAlive;
// The floor's readiness and stream reading, under the names the routes have always used.
pub(crate) use crate::floor::attribute;
pub(crate) use crate::floor::ready::{
    Consumer, is_stream_ordered, needs_settling, order_consumer, settled,
};
use route::Route;

/// What keeps an import's memory valid.
pub(crate) enum Pin {
    /// An owner: a DLPack managed tensor, a held buffer, the owner of a view's tensor.
    Owner(Owner),
    /// A reference to this object: a PyTorch storage.
    Object(Py<PyAny>),
    /// The imported object itself (an interface's exporter): whoever holds it pins the memory.
    /// A borrowed argument is held by the call; an owned tensor holds it in its owner.
    Caller,
}

/// An import's result before it becomes a [`Tensor`] (or stays a borrowed argument): the
/// validated description, where its data is ready, and what pins its memory.
pub(crate) struct Imported {
    pub(crate) desc: Descriptor,
    pub(crate) ready: Ready,
    pub(crate) pin: Pin,
    /// The producer framework's current stream when the import read it (PyTorch's, for CUDA
    /// tensors): what a kernel call runs on, without asking again.
    pub(crate) current: Option<Current>,
    /// Why the import is read-only, where that changes what a view of it hands out
    /// (`crate::floor::access`: \[access\]).
    pub(crate) provenance: Provenance,
}

/// A framework's current stream, as an import found it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Current {
    pub(crate) stream: Stream,
    /// The framework never destroys it (PyTorch's default and pool streams).
    pub(crate) immortal: bool,
}

impl Imported {
    /// The owner a [`Tensor`] of this import holds (`obj` is the imported object): what pins
    /// the memory, and the producer object too (a view keeps its producer alive, as the
    /// crate docs promise; only the pin keeps the memory).
    pub(crate) fn owner(&self, obj: &Bound<'_, PyAny>) -> Owner {
        let object = obj.clone().unbind();
        match &self.pin {
            Pin::Owner(owner) if owned_by_view(obj) => owner.clone(),
            Pin::Owner(owner) => KeepAlive::owner(object, Some(owner.clone())),
            Pin::Object(pinned) => KeepAlive::pinning(object, pinned.clone_ref(obj.py())),
            Pin::Caller => KeepAlive::owner(object, None),
        }
    }

    /// The tensor, owning what pins the memory (and the producer object, as [`owner`]).
    ///
    /// [`owner`]: Imported::owner
    pub(crate) fn into_tensor(self, obj: &Bound<'_, PyAny>) -> Tensor {
        let object = obj.clone().unbind();
        let owner = match self.pin {
            Pin::Owner(owner) if owned_by_view(obj) => owner,
            Pin::Owner(owner) => KeepAlive::owner(object, Some(owner)),
            Pin::Object(pinned) => KeepAlive::pinning(object, pinned),
            Pin::Caller => KeepAlive::owner(object, None),
        };
        // SAFETY: from_descriptor \[span\] and \[no-race\]: every route made `desc` from what
        // the pin keeps valid (the invariants above), and `owner` holds the pin;
        let tensor = unsafe { Tensor::from_descriptor(self.desc, owner) };
        // SAFETY: with_ready: every route's readiness is true and names only streams that
        // outlive the tensor (\[ready\]); `settle` turned thread-bound ones into events.
        unsafe { tensor.with_ready(self.ready) }
    }
}

/// Whether `obj` is one of our views: its tensor's owner is shared as it is (a view of a view
/// is the same tensor, holding nothing more).
fn owned_by_view(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_instance_of::<View>()
}

/// Imports `obj` as an owned [`Tensor`] (the memory pinned by its owner), its readiness
/// settled so it may cross threads.
pub(crate) fn import_tensor(obj: &Bound<'_, PyAny>, consumer: Consumer) -> Result<Tensor> {
    let mut imported = import(obj, consumer)?;
    settle(&mut imported)?;
    Ok(imported.into_tensor(obj))
}

/// Imports `obj`: the route of its type, its memory pinned, a consumer stream ordered after
/// the producer (GPU-side).
pub(crate) fn import(obj: &Bound<'_, PyAny>, consumer: Consumer) -> Result<Imported> {
    // Owners made here may be released by threads that take the GIL (the reaper): the exit
    // must wait for them (`ffi::exit`). One atomic load once installed.
    // Routes run Python code under this frame (PyTorch's methods, producers' `__dlpack__`),
    // which may give the GIL up and take it back: held off once the exit has begun
    // (`ffi::exit::enter_python`, which also installs the exit function).
    let _python = crate::ffi::exit::enter_python(obj.py());
    let facts = route::facts(obj)?;
    match facts.route {
        Route::OwnView => {
            let view = obj.cast::<View>().map_err(PyErr::from)?;
            let t = view.get().tensor();
            order_consumer(t.descriptor(), t.ready(), consumer)?;
            Ok(Imported {
                desc: t.descriptor().clone(),
                ready: t.ready().clone(),
                pin: Pin::Owner(t.owner().clone()),
                current: None,
                provenance: view.get().provenance(),
            })
        }
        Route::Numpy => match buffer::ndarray(obj)? {
            Some(imported) => Ok(imported),
            None => general(obj, &facts, consumer),
        },
        Route::Torch(api, table) => match torch::import(obj, api, table, consumer) {
            Ok(Some(imported)) => Ok(imported),
            // Not through the table (a conjugated tensor): `__dlpack__` says why.
            Ok(None) => general(obj, &facts, consumer),
            Err(Error::Python(e)) => ask_dlpack(obj, &facts, consumer, e),
            Err(e) => Err(e),
        },
        Route::Exchange(api) => match dlpack::from_exchange(obj, api, &facts, consumer) {
            Ok(imported) => Ok(imported),
            Err(Error::Python(e)) => ask_dlpack(obj, &facts, consumer, e),
            Err(e) => Err(e),
        },
        Route::General => general(obj, &facts, consumer),
    }
}

/// After a table failed with `e`: the table's functions skip the producer's `__dlpack__`
/// checks and report what they cannot export as C++ errors with backtraces (PyTorch: sparse,
/// mkldnn, quantized, bit and meta tensors, where `__dlpack__` raises `BufferError` with a
/// one-line message). `__dlpack__` says why, in the producer's words, or exports what the
/// table could not; `e` without the C++ frames is kept for a producer without `__dlpack__`.
fn ask_dlpack(
    obj: &Bound<'_, PyAny>,
    facts: &route::TypeFacts,
    consumer: Consumer,
    e: PyErr,
) -> Result<Imported> {
    match general(obj, facts, consumer) {
        Err(Error::NotATensor { .. }) => {
            Err(Error::Python(exchange::without_cpp_frames(obj.py(), e)))
        }
        other => other,
    }
}

/// The protocols one by one, in the order of the crate docs. A producer that hands its
/// immutable arrays out flagless itself (JAX, TensorFlow: `facts.flagless_readonly`) is
/// read-only through whichever protocol answered (a JAX CUDA array's
/// `__cuda_array_interface__` says `readonly`, its `__dlpack__` may refuse a request its
/// interface then serves): its views go to legacy consumers as its own capsules would
/// (`crate::floor::access`), whatever the route.
fn general(
    obj: &Bound<'_, PyAny>,
    facts: &route::TypeFacts,
    consumer: Consumer,
) -> Result<Imported> {
    let mut imported = protocols(obj, facts, consumer)?;
    if facts.flagless_readonly {
        imported.provenance = crate::floor::access::flagless_producer(&imported.desc);
    }
    Ok(imported)
}

/// [`general`]'s protocols, in order.
fn protocols(
    obj: &Bound<'_, PyAny>,
    facts: &route::TypeFacts,
    consumer: Consumer,
) -> Result<Imported> {
    let py = obj.py();
    if facts.masked {
        refuse_masked(obj)?;
    }
    // A producer that refuses with `BufferError` (data DLPack cannot describe, such as
    // NumPy's ml_dtypes arrays) may still offer an interface or a buffer: try those, and
    // raise its refusal only if none is left.
    let mut refused = None;
    let capsule = obj.cast::<PyCapsule>().ok();
    if capsule.is_none() && obj.hasattr(pyo3::intern!(py, "__dlpack__"))? {
        match dlpack::from_dlpack(obj, facts, consumer) {
            // A producer whose type publishes an exchange table (PyTorch) implements DLPack
            // completely: its refusal is final (its other interfaces would refuse with
            // another exception type, or export what DLPack refused).
            Err(Error::Python(e))
                if e.is_instance_of::<pyo3::exceptions::PyBufferError>(py) && !facts.published =>
            {
                refused = Some(Error::Python(e));
            }
            // A capsule whose description does not validate, from a producer that also offers
            // an array interface: CuPy 14.2 exports negative strides through DLPack as
            // `(u64)byte_stride / itemsize` (2**62 - 1 for -4 bytes of float32), while its
            // `__cuda_array_interface__` says -4. The capsule is already given back (its
            // deleter ran once); the interface is validated on its own below, and its error is
            // the one raised if it fails too.
            Err(e @ Error::Dlpack(tensorbridge_dlpack::Error::Core(_)))
                if !facts.published && has_interface(obj)? =>
            {
                refused = Some(e);
            }
            result => return result,
        }
    }
    if let Some(capsule) = capsule
        && capsule::is_dlpack_capsule(capsule)
    {
        // A capsule carries no stream: its producer ordered whatever it had to when it made
        // it. Its producer is unknown: a legacy capsule is read-only (\[access\]).
        return dlpack::from_capsule(capsule, tensorbridge_core::Access::ReadOnly);
    }
    if let Some(cai) = attribute(obj, pyo3::intern!(py, "__cuda_array_interface__"))? {
        return interfaces::from_cai(obj, &cai, consumer);
    }
    if let Some(ai) = attribute(obj, pyo3::intern!(py, "__array_interface__"))? {
        return interfaces::from_array_interface(obj, &ai);
    }
    if let Some(held) = buffer::hold(obj)? {
        return buffer::imported(held);
    }
    Err(refused.unwrap_or_else(|| Error::NotATensor {
        type_name: type_name(obj),
    }))
}

/// Whether `obj` offers `__cuda_array_interface__` or `__array_interface__`.
fn has_interface(obj: &Bound<'_, PyAny>) -> Result<bool> {
    let py = obj.py();
    Ok(obj.hasattr(pyo3::intern!(py, "__cuda_array_interface__"))?
        || obj.hasattr(pyo3::intern!(py, "__array_interface__"))?)
}

/// Refuses a NumPy masked array (`obj`'s type is one) that masks elements: it inherits
/// `__dlpack__` and `__array_interface__` from `ndarray`, and neither carries the mask, so a
/// view would show masked elements as valid. Arrays without a mask (`nomask`, or all `False`)
/// pass.
fn refuse_masked(obj: &Bound<'_, PyAny>) -> Result<()> {
    let Some(mask) = attribute(obj, pyo3::intern!(obj.py(), "mask"))? else {
        return Ok(());
    };
    let masked: u64 = mask.call_method0("sum")?.extract()?;
    if masked == 0 {
        return Ok(());
    }
    let total: u64 = obj.getattr(pyo3::intern!(obj.py(), "size"))?.extract()?;
    Err(Error::Masked { masked, total })
}

/// A readiness that names a stream only on this thread, or only with this thread's current
/// device, becomes an event recorded now, so the tensor can cross threads (Views do): the
/// per-thread default stream (`2`), and default streams of pinned and managed memory (whose
/// device names no GPU). Anything else is kept as it is.
pub(crate) fn settle(imported: &mut Imported) -> Result<()> {
    if needs_settling(&imported.ready, imported.desc.device().kind) {
        imported.ready = settled(&imported.desc, &imported.ready)?;
    }
    Ok(())
}

/// An append-only set of stream handles, read without a lock: the handles of streams known
/// never to be destroyed. Full at [`HandleSet::CAPACITY`]; past that, lookups miss (and the
/// caller takes the slower, always-correct way).
pub(crate) struct HandleSet {
    slots: [AtomicUsize; HandleSet::CAPACITY],
    len: AtomicUsize,
    write: std::sync::Mutex<()>,
}

impl HandleSet {
    const CAPACITY: usize = 256;

    pub(crate) const fn new() -> HandleSet {
        HandleSet {
            slots: [const { AtomicUsize::new(0) }; HandleSet::CAPACITY],
            len: AtomicUsize::new(0),
            write: std::sync::Mutex::new(()),
        }
    }

    pub(crate) fn contains(&self, handle: usize) -> bool {
        let len = self.len.load(Ordering::Acquire);
        self.slots[..len]
            .iter()
            .any(|s| s.load(Ordering::Relaxed) == handle)
    }

    pub(crate) fn insert(&self, handle: usize) {
        let _write = self
            .write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.contains(handle) {
            return;
        }
        let len = self.len.load(Ordering::Acquire);
        if len < HandleSet::CAPACITY {
            self.slots[len].store(handle, Ordering::Relaxed);
            self.len.store(len + 1, Ordering::Release);
        }
    }
}
