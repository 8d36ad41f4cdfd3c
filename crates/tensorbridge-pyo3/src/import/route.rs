//! What an import does with objects of one type, decided once per type: the route, and the
//! facts about the type the routes need. Facts about the object itself (its shape, whether
//! this tensor requires grad) are never cached ([type] in the invariants of `import`).

use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use pyo3::prelude::*;
use pyo3::types::{PyString, PyType};

use crate::error::Result;
use crate::floor::view::View;
use crate::import::exchange::{self, ExchangeApi};

/// How objects of a type are imported.
#[derive(Clone, Copy)]
pub(crate) enum Route {
    /// A `tensorbridge.View`: its tensor, as it is.
    OwnView,
    /// Exactly `numpy.ndarray`: its buffer when that describes the array exactly, else the
    /// general way.
    Numpy,
    /// PyTorch's tensors, through the table's non-owning `DLTensor` with the storage pinned
    /// (`import::torch`); which of PyTorch's tables the type publishes.
    Torch(ExchangeApi, TorchTable),
    /// Another producer's exchange table: its owning export.
    Exchange(ExchangeApi),
    /// The protocols one by one (`__dlpack__`, a capsule, the interfaces, the buffer).
    General,
}

/// Which of PyTorch's exchange tables a type publishes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum TorchTable {
    /// `torch.Tensor`'s own.
    Ordinary,
    /// The const table (PyTorch 2.14 and later, `torch._C._const_dlpack_exchange_api()`),
    /// which `torch.utils.dlpack.ReadOnlyTensorWrapper` publishes: its exports are read-only.
    ReadOnly,
}

/// What an import knows about `type(obj)`.
#[derive(Clone, Copy)]
pub(crate) struct TypeFacts {
    pub(crate) route: Route,
    /// The type publishes an exchange table (used or not): its `__dlpack__` is a complete
    /// DLPack producer, and a refusal from it is final.
    pub(crate) published: bool,
    /// A NumPy masked array type (`numpy.ma`): its mask travels in no protocol.
    pub(crate) masked: bool,
    /// A CuPy type: CuPy has a current stream (`kernel_call`).
    pub(crate) cupy: bool,
    /// A producer known to hand out writable memory through legacy DLPack capsules (NumPy,
    /// PyTorch, CuPy): its legacy capsules are read-write. Every other legacy capsule is
    /// read-only ([access]: JAX arrays and TensorFlow tensors are immutable, and the legacy
    /// struct has no flag to say so).
    pub(crate) writable_legacy: bool,
    /// A producer whose arrays are immutable and which hands them out in legacy capsules
    /// (no read-only flag) when asked for one: JAX (every version; 0.12 gives versioned
    /// read-only capsules to consumers that ask for them) and TensorFlow. A read-only view of
    /// its arrays may be handed out flagless as it would ([access], `crate::floor::access`).
    pub(crate) flagless_readonly: bool,
}

/// The protocol methods a subclass may override to change what the table would export.
const PROTOCOL: [&str; 3] = ["__dlpack__", "__dlpack_device__", "__torch_function__"];

/// One cached type: the type (held, so its address is never another type's), its facts, and,
/// for a type whose table route must be re-verified per call, what its protocol attributes
/// resolved to when it was classified.
struct Entry {
    ty: Py<PyType>,
    facts: TypeFacts,
    verify: Option<[Option<Py<PyAny>>; 3]>,
}

/// The most types [`facts`] remembers.
const TYPE_CACHE: usize = 64;

/// `type(obj)`'s facts.
///
/// Cached per type, lock-free for readers (the cache holds a strong reference to each type
/// and at most [`TYPE_CACHE`] of them; past that, types are classified on every call).
/// PyTorch's own classes (`torch.Tensor`, `torch.nn.Parameter`...) and NumPy's are taken as
/// they were when first seen. A subclass defined elsewhere that takes the table route is
/// re-verified on every call: if one of its protocol methods ([`PROTOCOL`]) now resolves to
/// something else (a `__dlpack__` override added after its first import), it is classified
/// again, so the override is asked. Errors are never cached.
pub(crate) fn facts(obj: &Bound<'_, PyAny>) -> Result<TypeFacts> {
    /// Entries published in order: `LEN` counts the filled slots. Entries are never removed
    /// or changed, and leaked with the process.
    static SLOTS: [AtomicPtr<Entry>; TYPE_CACHE] =
        [const { AtomicPtr::new(std::ptr::null_mut()) }; TYPE_CACHE];
    static LEN: AtomicUsize = AtomicUsize::new(0);
    static WRITE: Mutex<()> = Mutex::new(());

    let ty = obj.get_type_ptr();
    let cached = |len: usize| {
        SLOTS[..len].iter().find_map(|slot| {
            let entry = slot.load(Ordering::Acquire);
            // SAFETY: a slot below `LEN` holds an entry from `Box::into_raw`, fully written
            // before it was published (Release, read here with Acquire) and never freed.
            let entry = unsafe { &*entry };
            (entry.ty.as_ptr().cast() == ty).then_some(entry)
        })
    };
    if let Some(entry) = cached(LEN.load(Ordering::Acquire)) {
        match &entry.verify {
            None => return Ok(entry.facts),
            Some(resolved) if unchanged(&obj.get_type(), resolved)? => return Ok(entry.facts),
            // Changed since it was cached: classified afresh, every call, from now on.
            Some(_) => return Ok(classify(obj)?.facts),
        }
    }
    let classified = classify(obj)?;
    // Poisoning cannot leave the slots inconsistent (an entry is published whole).
    let _write = WRITE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let len = LEN.load(Ordering::Acquire);
    let facts = classified.facts;
    if len < TYPE_CACHE && cached(len).is_none() {
        let entry = Box::into_raw(Box::new(classified));
        SLOTS[len].store(entry, Ordering::Release);
        LEN.store(len + 1, Ordering::Release);
    }
    Ok(facts)
}

/// Whether `ty`'s protocol attributes still resolve to `resolved`.
fn unchanged(ty: &Bound<'_, PyType>, resolved: &[Option<Py<PyAny>>; 3]) -> Result<bool> {
    for (name, was) in PROTOCOL.iter().zip(resolved) {
        let now = attribute(ty, &PyString::new(ty.py(), name))?;
        let same = match (&now, was) {
            (None, None) => true,
            (Some(now), Some(was)) => now.is(was),
            _ => false,
        };
        if !same {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `ty.<name>`, or `None` when it has no such attribute.
fn attribute<'py>(
    ty: &Bound<'py, PyType>,
    name: &Bound<'py, PyString>,
) -> Result<Option<Bound<'py, PyAny>>> {
    match ty.getattr(name) {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(ty.py()) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// [`facts`] without the cache.
fn classify(obj: &Bound<'_, PyAny>) -> Result<Entry> {
    let ty = obj.get_type();
    // A class made without a module (`type(...)` under globals without `__name__`) has no
    // `__module__`: it is none of the kinds below.
    let module = ty
        .module()
        .ok()
        .and_then(|m| m.to_cow().ok().map(|m| m.into_owned()))
        .unwrap_or_default();
    let torch_own = module == "torch" || module.starts_with("torch.");
    let numpy = module == "numpy" || module.starts_with("numpy.");
    let cupy = module == "cupy" || module.starts_with("cupy.");
    let of = |package: &str| module == package || module.starts_with(&format!("{package}."));
    let mut facts = TypeFacts {
        route: Route::General,
        published: false,
        masked: module.starts_with("numpy.ma"),
        cupy,
        writable_legacy: false,
        flagless_readonly: of("jax") || of("jaxlib") || of("tensorflow"),
    };
    if obj.is_instance_of::<View>() {
        facts.route = Route::OwnView;
        return Ok(Entry {
            ty: ty.unbind(),
            facts,
            verify: None,
        });
    }
    let api = exchange::lookup(&ty)?;
    facts.published = api.is_some();
    let (overridden, publisher) = match api {
        Some(_) => overrides_protocol(&ty)?,
        None => (false, None),
    };
    let torch_table = publisher.as_ref().is_some_and(|class| {
        class
            .getattr(pyo3::intern!(obj.py(), "__module__"))
            .and_then(|m| m.extract::<String>())
            .is_ok_and(|m| m == "torch" || m.starts_with("torch."))
    });
    facts.writable_legacy = numpy || cupy || torch_own || torch_table;
    let mut verify = None;
    match api {
        Some(api) if !overridden => {
            facts.route = if torch_table {
                let table = if exchange::is_torch_const_table(obj.py(), api) {
                    TorchTable::ReadOnly
                } else {
                    TorchTable::Ordinary
                };
                Route::Torch(api, table)
            } else {
                Route::Exchange(api)
            };
            // [type]: a class outside PyTorch may gain an override later; its attributes as
            // they resolve now are what each call compares against.
            if !torch_own {
                let mut resolved: [Option<Py<PyAny>>; 3] = [None, None, None];
                for (slot, name) in resolved.iter_mut().zip(PROTOCOL) {
                    *slot = attribute(&ty, &PyString::new(obj.py(), name))?.map(Bound::unbind);
                }
                verify = Some(resolved);
            }
        }
        _ => {
            let exact_ndarray = module == "numpy"
                && ty
                    .qualname()
                    .is_ok_and(|q| q.to_cow().is_ok_and(|q| q == "ndarray"));
            if exact_ndarray {
                facts.route = Route::Numpy;
            }
        }
    }
    Ok(Entry {
        ty: ty.unbind(),
        facts,
        verify,
    })
}

/// Whether `ty` overrides a [`PROTOCOL`] method of the class that publishes its table:
/// whether a class that defines one comes before the publisher in `ty`'s method resolution
/// order; and the publisher, when it comes first. `torch.Tensor` defines them all itself; a
/// subclass that defines none inherits them. PyTorch's
/// `__torch_function__ = torch._C._disabled_torch_function_impl` (what `nn.Parameter` sets)
/// turns the protocol off rather than changing it, and is no override.
fn overrides_protocol<'py>(ty: &Bound<'py, PyType>) -> Result<(bool, Option<Bound<'py, PyAny>>)> {
    let py = ty.py();
    let table = pyo3::intern!(py, "__dlpack_c_exchange_api__");
    let disabled = disabled_torch_function(py);
    let mro = ty.mro();
    for class in mro.iter() {
        let dict = class.getattr(pyo3::intern!(py, "__dict__"))?;
        if dict.contains(table)? {
            // The publisher, reached before any override.
            return Ok((false, Some(class)));
        }
        for name in PROTOCOL {
            let Some(defined) = dict.get_item(name).ok() else {
                continue;
            };
            let is_disabled =
                name == "__torch_function__" && disabled.as_ref().is_some_and(|d| defined.is(d));
            if !is_disabled {
                return Ok((true, None));
            }
        }
    }
    Ok((false, None))
}

/// `torch._C._disabled_torch_function_impl`, when PyTorch is imported (it is, whenever a
/// type publishes PyTorch's table).
fn disabled_torch_function(py: Python<'_>) -> Option<Bound<'_, PyAny>> {
    let modules = py.import("sys").ok()?.getattr("modules").ok()?;
    let c = modules.get_item("torch._C").ok()?;
    c.getattr("_disabled_torch_function_impl").ok()
}
