// The C++ side of tensorbridge-tch: the few libtorch calls tch 0.24 does not expose.
//
//  - tb_tch_describe:       everything `tensorbridge_tch::import` needs of a tensor, in one call,
//                           with a reference to its storage for the owner;
//  - tb_tch_storage_release: drops such a reference (exactly once per describe that took one);
//  - tb_tch_storage_use_count: the count of a tensor's storage (the tests count with it);
//  - tb_tch_current_stream: libtorch's current stream of a device, as a raw handle;
//  - tb_tch_current_stream_id: the same, with libtorch's id for it (which says whether the
//                           stream is one of libtorch's own or an external one);
//  - tb_tch_from_blob:      `at::for_blob` with a context and its deleter, which libtorch calls
//                           exactly once, when the storage is freed (tch's `from_blob` has none);
//  - tb_tch_to_dlpack_versioned: libtorch's own DLPack export (the tests use it).
//
// Every function is `noexcept`: a C++ exception must never unwind into Rust. Each returns 0 on
// success; on failure it returns 1 and stores a message allocated with `malloc` in `*err`, which
// the caller frees with `tb_tch_free_error`. `at::Tensor*` is what tch calls `C_tensor*`: a heap
// `at::Tensor` (`torch::Tensor` is the same type).
//
// Only ATen and c10 headers: `<torch/torch.h>` costs ~15 s per build (measured).

#include <ATen/DLConvertor.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>

extern "C" {

// Mirrors `ffi::TensorInfo` in src/ffi.rs (whose layout assertions pin the offsets).
struct tb_tch_info {
  void* data;              // address of element 0 (`data_ptr()`), null for some empty tensors
  const int64_t* sizes;    // `ndim` extents, borrowed from the tensor (valid while it is unchanged)
  const int64_t* strides;  // `ndim` strides in elements, borrowed likewise
  int64_t ndim;
  int64_t storage_offset;  // in elements
  int64_t itemsize;        // bytes per element
  int8_t scalar_type;      // c10::ScalarType
  int8_t device_type;      // c10::DeviceType
  int8_t device_index;     // c10::DeviceIndex, -1 when none
  int8_t layout;           // c10::Layout
  uint8_t defined;         // 0: an undefined tensor; nothing else was filled in
  uint8_t is_conj;
  uint8_t is_neg;
  uint8_t reserved;
  // One reference to the tensor's `c10::StorageImpl` (an `intrusive_ptr` released to a raw
  // pointer), taken last, only when everything else succeeded; null otherwise. The caller
  // owns it and gives it back with `tb_tch_storage_release`, exactly once.
  void* storage;
};

static_assert(sizeof(tb_tch_info) == 64, "tb_tch_info must match ffi::TensorInfo");
static_assert(sizeof(c10::ScalarType) == 1 && sizeof(c10::DeviceType) == 1 &&
                  sizeof(c10::DeviceIndex) == 1 && sizeof(c10::Layout) == 1,
              "the codes are int8_t");

void tb_tch_free_error(char* err) noexcept { std::free(err); }

}  // extern "C"

namespace {

// Copies `msg` into a `malloc`ed string for `tb_tch_free_error`; null if even that fails.
char* copy_message(const char* msg) noexcept {
  size_t len = std::strlen(msg);
  char* out = static_cast<char*>(std::malloc(len + 1));
  if (out != nullptr) {
    std::memcpy(out, msg, len + 1);
  }
  return out;
}

// Runs `f`; turns any exception into a return value of 1 and a message in `*err`.
template <typename F>
int guarded(char** err, F&& f) noexcept {
  *err = nullptr;
  try {
    f();
    return 0;
  } catch (const c10::Error& e) {
    // Without the C++ backtrace libtorch appends to `what()`.
    *err = copy_message(e.what_without_backtrace());
  } catch (const std::exception& e) {
    *err = copy_message(e.what());
  } catch (...) {
    *err = copy_message("unknown C++ exception");
  }
  return 1;
}

}  // namespace

extern "C" {

int tb_tch_describe(const at::Tensor* t, tb_tch_info* out, char** err) noexcept {
  return guarded(err, [&] {
    std::memset(out, 0, sizeof(*out));
    if (!t->defined()) {
      return;
    }
    out->scalar_type = static_cast<int8_t>(t->scalar_type());
    out->device_type = static_cast<int8_t>(t->device().type());
    out->device_index = static_cast<int8_t>(t->device().index());
    out->layout = static_cast<int8_t>(t->layout());
    out->is_conj = t->is_conj() ? 1 : 0;
    out->is_neg = t->is_neg() ? 1 : 0;
    out->defined = 1;
    if (t->layout() != c10::kStrided) {
      return;  // no strides or single data pointer to report; the caller refuses it
    }
    auto sizes = t->sizes();
    auto strides = t->strides();
    out->ndim = static_cast<int64_t>(sizes.size());
    out->sizes = sizes.data();
    out->strides = strides.data();
    out->storage_offset = t->storage_offset();
    out->itemsize = static_cast<int64_t>(t->itemsize());
    // The mutable pointer, as tch's `data_ptr()`: a copy-on-write storage is materialised
    // first, so writes through the shared memory never reach another tensor's data.
    // Throws for tensors without storage (meta, functional wrappers).
    out->data = t->data_ptr();
    // Last, so that nothing can throw once the reference is taken: one atomic increment of
    // the storage's count (no tensor, no allocation, no dispatcher call). Rebinding `t`
    // (`set_`, `set_data`) swaps the storage `t` points at and leaves this one alive.
    c10::Storage storage = t->storage();
    out->storage = storage.unsafeReleaseStorageImpl();
  });
}

void tb_tch_storage_release(void* storage) noexcept {
  if (storage != nullptr) {
    // Takes back the reference `tb_tch_describe` released; dropping it may free the storage
    // (and run its `DataPtr` deleter) here. Destructors are `noexcept`: nothing unwinds.
    auto reclaimed =
        c10::intrusive_ptr<c10::StorageImpl>::reclaim(static_cast<c10::StorageImpl*>(storage));
  }
}

// How many references `t`'s storage has (tensors over it and references `tb_tch_describe`
// took), -1 without one; the tests count the owner's reference with it. `unsafe_storage`
// never throws (`storage()` does for some tensors), and this function must not.
int64_t tb_tch_storage_use_count(const at::Tensor* t) noexcept {
  if (!t->defined() || !t->unsafeGetTensorImpl()->has_storage()) {
    return -1;
  }
  return static_cast<int64_t>(t->unsafeGetTensorImpl()->unsafe_storage().use_count());
}

int tb_tch_current_stream(int8_t device_type, int8_t device_index, void** out,
                          char** err) noexcept {
  return guarded(err, [&] {
    auto type = static_cast<c10::DeviceType>(device_type);
    // Throws when libtorch has no backend for `type` (a CPU-only build, or libtorch_cuda not
    // loaded), or for an index the backend does not have (no GPU).
    const auto* impl = c10::impl::getDeviceGuardImpl(type);
    c10::Stream stream = impl->getStream(c10::Device(type, device_index));
    *out = stream.native_handle();
  });
}

int tb_tch_current_stream_id(int8_t device_type, int8_t device_index, void** out, int64_t* id,
                             char** err) noexcept {
  return guarded(err, [&] {
    auto type = static_cast<c10::DeviceType>(device_type);
    const auto* impl = c10::impl::getDeviceGuardImpl(type);
    c10::Stream stream = impl->getStream(c10::Device(type, device_index));
    *out = stream.native_handle();
    // c10/cuda's `StreamId`: 0 for the default stream, odd for the streams of libtorch's own
    // pools, and the `cudaStream_t` itself (even, nonzero) for a stream made from an external
    // handle (`getStreamFromExternal`, `torch.cuda.ExternalStream`).
    *id = static_cast<int64_t>(stream.id());
  });
}

int tb_tch_from_blob(void* data, const int64_t* sizes, const int64_t* strides, int64_t ndim,
                     int8_t scalar_type, int8_t device_type, int8_t device_index, void* ctx,
                     void (*release)(void*), at::Tensor** out, char** err) noexcept {
  // From here on `ctx` is released exactly once on every path: by libtorch when the storage is
  // freed, or by the unwinding of a failed call (the guard, then the maker and the half-made
  // tensor, each own it in turn).
  std::unique_ptr<void, void (*)(void*)> guard(ctx, release);
  return guarded(err, [&] {
    // `TensorOptions::dtype` is `noexcept` and terminates on a code it does not know: check.
    TORCH_CHECK(scalar_type >= 0 &&
                    scalar_type < static_cast<int8_t>(c10::ScalarType::NumOptions),
                "unknown scalar type ", static_cast<int>(scalar_type));
    c10::Device device(static_cast<c10::DeviceType>(device_type), device_index);
    auto options = at::TensorOptions()
                       .dtype(static_cast<c10::ScalarType>(scalar_type))
                       .device(device);
    // `context` (a plain function pointer) rather than `from_blob`'s `std::function` deleter:
    // the same `DataPtr` mechanism, without allocating the function object. `target_device`
    // skips libtorch's pointer query (`cudaPointerGetAttributes`): the caller vouches for it.
    at::Tensor tensor = at::for_blob(data, c10::IntArrayRef(sizes, static_cast<size_t>(ndim)))
                            .context(guard.release(), release)
                            .strides(c10::IntArrayRef(strides, static_cast<size_t>(ndim)))
                            .options(options)
                            .target_device(device)
                            .make_tensor();
    *out = new at::Tensor(std::move(tensor));
  });
}

int tb_tch_to_dlpack_versioned(const at::Tensor* t, void** out, char** err) noexcept {
  return guarded(err, [&] { *out = at::toDLPackVersioned(*t); });
}

}  // extern "C"
