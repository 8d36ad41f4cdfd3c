//! The read-only rule: what a view hands out is decided by its access and by WHY it is
//! read-only (its [`Provenance`]).
//!
//! For every producer and consumer, the outcome through a view is the direct hand-off's
//! outcome, or a strictly safer one only where the consumer can be told (a versioned
//! capsule's `READ_ONLY` flag, the interfaces' `readonly` field); never a refusal the producer
//! would not make, never an access the producer refuses. Read-only access that tensorbridge
//! knows of itself (a view made read-only on request, a share opened read-only, a legacy
//! capsule of an unknown producer overlapping one of its live read-only exports) keeps its
//! strictness: no flagless hand-off. A producer known to hand its arrays out flagless
//! (JAX, TensorFlow) is taken at its word through every protocol ([`flagless_producer`]).
//! ARCHITECTURE.md ("The read-only rule") has the reasons, docs/PROTOCOLS.md ("Outcome
//! matrix") every producer and consumer.
//!
//! | provenance | legacy capsule, borrowed `DLTensor` (no flags) | versioned capsule, exchange table's managed export | CAI | array interface |
//! |---|---|---|---|---|
//! | writable | yes | yes | yes | yes |
//! | [`Provenance::Flagged`] read-only | refused (`ReadOnlyLegacy`, `NoFlags`) | `READ_ONLY` | `readonly` | `readonly` |
//! | [`Provenance::Flagless`] | yes, as the producer hands it | `READ_ONLY` | `readonly` | `readonly` |
//! | [`Provenance::Refused`] | refused (`RequiresGrad`, `NoFlags`) | `__dlpack__`: refused (`RequiresGrad`); the exchange table: `READ_ONLY` | refused (`RequiresGradInterface`) | `readonly` |

use tensorbridge_core::{Access, Descriptor};

/// Why a view is read-only, where that changes what it may hand out. Writable views are
/// handed out every way, whatever this says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Provenance {
    /// The access is all there is: read-only goes out as a flag where the protocol has one,
    /// and nothing goes out where it has none. What tensorbridge knows or was told (a
    /// `readonly=True` view, a share opened read-only, memory one of its read-only exports
    /// lent), a producer's own flag (a versioned capsule's `READ_ONLY`, a read-only buffer),
    /// and everything made in Rust (`export`).
    #[default]
    Flagged,
    /// Read-only memory its producer hands out without a flag itself: a legacy capsule the
    /// producer gave (JAX before 0.12, TensorFlow, a bare capsule: read-only only because a
    /// legacy capsule cannot say otherwise), or an array of a producer whose arrays are
    /// immutable and which gives legacy capsules of them when asked for one (JAX, every
    /// version; TensorFlow). A consumer that asks for a legacy capsule gets the one the
    /// producer would have given it; every other consumer is told read-only.
    Flagless,
    /// Memory its producer's Python protocols refuse (a PyTorch tensor that requires grad:
    /// its `__dlpack__` raises `BufferError`, its CUDA Array Interface `RuntimeError`, and
    /// `torch.from_dlpack`, which ignores DLPack's read-only flag, would get a writable alias
    /// of it). Refused the same way by `__dlpack__` and the CUDA Array Interface, whose
    /// consumers include ones that ignore the flag and cannot be told apart. Readable where
    /// the producer lets it be read: Rust (kernel inputs, other extensions through the
    /// exchange table, `READ_ONLY` set: PyTorch's own table exports such tensors, without
    /// the flag) and the array interface (NumPy honours its `readonly`).
    Refused,
}

/// A PyTorch tensor's access and provenance, from whether it requires grad: read-only and
/// [`Provenance::Refused`] when it does (PyTorch's `__dlpack__` refuses it; a write would
/// bypass autograd), writable otherwise. Called where the PyTorch import decides access.
pub(crate) fn torch(requires_grad: bool) -> (Access, Provenance) {
    if requires_grad {
        (Access::ReadOnly, Provenance::Refused)
    } else {
        (Access::ReadWrite, Provenance::Flagged)
    }
}

/// The provenance of an import a producer handed over read-only without a flag to say so
/// (`desc`): [`Provenance::Flagless`], unless the memory overlaps one of tensorbridge's own
/// live read-only exports (then it knows better: [`Provenance::Flagged`]). Writable imports
/// are [`Provenance::Flagged`] (nothing to decide).
pub(crate) fn flagless(desc: &Descriptor) -> Provenance {
    if desc.is_readonly() && !tensorbridge_dlpack::lent_readonly(desc) {
        Provenance::Flagless
    } else {
        Provenance::Flagged
    }
}

/// The provenance of an import from a producer that hands its immutable arrays out without
/// a flag itself (JAX, TensorFlow: `TypeFacts::flagless_readonly`), through any of its
/// protocols: [`Provenance::Flagless`] when read-only. Unlike [`flagless`], the memory
/// tensorbridge has lent read-only does not count: the producer's own `__dlpack__` hands the
/// array to a legacy consumer flagless whatever else aliases it, so the direct hand-off's
/// outcome is the legacy capsule (a JAX array viewed, handed to PyTorch, and viewed again
/// for JAX 0.11 was refused while PyTorch held the first export). A read-only view
/// tensorbridge made on request stays [`Provenance::Flagged`]: it is a view, not the
/// producer's array.
pub(crate) fn flagless_producer(desc: &Descriptor) -> Provenance {
    if desc.is_readonly() {
        Provenance::Flagless
    } else {
        Provenance::Flagged
    }
}

/// Whether a read-only `desc` of this provenance may go out without a flag (a legacy
/// capsule, a borrowed `DLTensor`): only as its producer hands it.
pub(crate) fn flagless_allowed(desc: &Descriptor, provenance: Provenance) -> bool {
    !desc.is_readonly() || provenance == Provenance::Flagless
}

#[cfg(test)]
mod tests {
    use tensorbridge_core::{Access, DType, RawTensor, Tensor};

    use super::{Provenance, flagless, flagless_allowed, flagless_producer, torch};

    fn host(access: Access) -> (Tensor, tensorbridge_core::Descriptor) {
        let t = Tensor::from_vec(vec![0.0f32; 4], &[4]).unwrap();
        let desc = RawTensor {
            access,
            ..RawTensor::host(t.data_ptr(), DType::FLOAT32, &[4])
        }
        .validate()
        .unwrap();
        (t, desc)
    }

    #[test]
    fn a_tensor_that_requires_grad_is_read_only_and_refused() {
        assert_eq!(torch(true), (Access::ReadOnly, Provenance::Refused));
        assert_eq!(torch(false), (Access::ReadWrite, Provenance::Flagged));
    }

    #[test]
    fn only_flagless_producers_go_out_without_a_flag() {
        let (_rw_owner, rw) = host(Access::ReadWrite);
        let (_ro_owner, ro) = host(Access::ReadOnly);
        for p in [
            Provenance::Flagged,
            Provenance::Flagless,
            Provenance::Refused,
        ] {
            assert!(
                flagless_allowed(&rw, p),
                "writable memory goes out every way"
            );
        }
        assert!(flagless_allowed(&ro, Provenance::Flagless));
        assert!(!flagless_allowed(&ro, Provenance::Flagged));
        assert!(!flagless_allowed(&ro, Provenance::Refused));
        // Handed over read-only without a flag: flagless, unless tensorbridge lent it
        // read-only itself (then it knows better).
        assert_eq!(flagless(&ro), Provenance::Flagless);
        assert_eq!(flagless(&rw), Provenance::Flagged);
        let (owner, _) = host(Access::ReadWrite);
        let lent = owner.clone().into_readonly();
        let export = tensorbridge_dlpack::export_versioned(&lent).unwrap();
        assert_eq!(flagless(lent.descriptor()), Provenance::Flagged);
        // A producer that hands its arrays out flagless itself is taken at its word.
        assert_eq!(flagless_producer(lent.descriptor()), Provenance::Flagless);
        assert_eq!(flagless_producer(&rw), Provenance::Flagged);
        drop(export);
        assert_eq!(flagless(lent.descriptor()), Provenance::Flagless);
    }
}
