// compat.h — the one place where torch 1.13 and torch 2.x differ for
// process_group_collie.cpp (one source builds against either).
//
// Design notes
// - torch 1.13: a backend is a c10d::ProcessGroup subclass; torch 2.x: a
//   c10d::Backend subclass, which torch's ProcessGroup holds per device
//   (register_backend(..., devices=[...])). Both take (rank, size), keep
//   rank_/size_, and share c10d::Work, the option structs and OpType.
// - COLLIE_TORCH2 is 1 on torch 2.x: the members that only 2.x declares
//   (abort(), shutdown(), the coalescing entry points) are compiled under it,
//   with `override` so a signature torch changes breaks the build here.
// - collie_torch::BackendBase names the base class (also for pybind: the
//   base's Python class is torch's own, registered by torch);
//   OptionalTensors is c10d::Work's optional input list (c10::optional on
//   1.13, std::optional on 2.x).
// - current_stream(device): torch's current stream of a CUDA device and its
//   cudaStream_t, through c10's device-guard registry (no CUDA headers:
//   c10::Stream::native_handle(), in libc10 since torch 2.2, asks the
//   device's DeviceGuardImpl). torch 1.13 has no native_handle(); its
//   backend takes CPU tensors only, so the CUDA side never runs there.
// - barrier_device(opts): BarrierOptions::device exists from torch 2.4 on
//   (by version, not checked on each minor).
// - GatherBase: torch's Backend::gather_into_tensor (in 2.15, not in 2.11:
//   the build against 2.11 failed on its `override`) is detected on the
//   base class the same way: where torch declares it, GatherBase overrides
//   it and forwards to the backend's gather_into_tensor_impl.
// - ShrinkBase: torch's Backend::supportsShrinking/shrink (dist.shrink_group;
//   torch 2.10 on, by the date of pytorch#164518, not checked on each minor)
//   is detected on the base class, not assumed from the version: where torch
//   declares it, ShrinkBase<..., true> overrides both (with `override`, so a
//   signature torch changes breaks the build there) and forwards shrink to
//   the backend's shrink_to; elsewhere (1.13, older 2.x) it adds nothing.
#pragma once

#include <type_traits>

#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#define COLLIE_TORCH2 1
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#define COLLIE_TORCH2 0
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

namespace collie_torch {

#if COLLIE_TORCH2
using BackendBase = c10d::Backend;
using OptionalTensors = std::optional<std::vector<at::Tensor>>;
#else
using BackendBase = c10d::ProcessGroup;
using OptionalTensors = c10::optional<std::vector<at::Tensor>>;
#endif

// Whether torch's base class declares supportsShrinking (and shrink), and
// gather_into_tensor (in 2.15's Backend, not in 2.11's).
template <class B, class = void> struct has_shrink : std::false_type {};
template <class B>
struct has_shrink<B, std::void_t<decltype(&B::supportsShrinking)>> : std::true_type {};
template <class B, class = void> struct has_gather_into_tensor : std::false_type {};
template <class B>
struct has_gather_into_tensor<B, std::void_t<decltype(&B::gather_into_tensor)>> : std::true_type {};

// BackendBase, plus torch's gather_into_tensor where it declares one
// (Derived::gather_into_tensor_impl does the work).
template <class Derived, bool = has_gather_into_tensor<BackendBase>::value>
class GatherBase : public BackendBase {
  public:
    using BackendBase::BackendBase;
};

#if COLLIE_TORCH2
template <class Derived> class GatherBase<Derived, true> : public BackendBase {
  public:
    using BackendBase::BackendBase;
    c10::intrusive_ptr<c10d::Work> gather_into_tensor(at::Tensor &out, at::Tensor &in,
                                                      const c10d::GatherOptions &opts) override {
        return static_cast<Derived *>(this)->gather_into_tensor_impl(out, in, opts);
    }
};
#endif

// The backend's base: GatherBase, plus torch's shrink where it has one
// (Derived::shrink_to does the work).
template <class Derived, bool = has_shrink<BackendBase>::value>
class ShrinkBase : public GatherBase<Derived> {
  public:
    using GatherBase<Derived>::GatherBase;
};

#if COLLIE_TORCH2
template <class Derived> class ShrinkBase<Derived, true> : public GatherBase<Derived> {
  public:
    using GatherBase<Derived>::GatherBase;
    bool supportsShrinking() const override { return true; }
    c10::intrusive_ptr<c10d::Backend>
    shrink(const std::vector<int64_t> &ranks_to_exclude, int shrink_flags,
           const c10::intrusive_ptr<c10d::Backend::Options> &opts) override {
        return static_cast<Derived *>(this)->shrink_to(ranks_to_exclude, shrink_flags, opts);
    }
};
#endif

// torch's current stream on CUDA device `d` (the caller's thread)
inline c10::Stream current_stream(const c10::Device &d) {
    return c10::impl::getDeviceGuardImpl(d.type())->getStream(d);
}

// The CUDA device a barrier is for: device_ids[0], else BarrierOptions'
// device (torch >= 2.4 fills it: the bound device or the current
// accelerator's); none: a barrier on the CPU.
inline std::optional<c10::Device> barrier_device(const c10d::BarrierOptions &opts) {
    if (COLLIE_TORCH2 && !opts.device_ids.empty())
        return c10::Device(c10::DeviceType::CUDA, (c10::DeviceIndex)opts.device_ids[0]);
#if COLLIE_TORCH2 && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 4)
    if (opts.device && opts.device->is_cuda()) return *opts.device;
#endif
    return std::nullopt;
}

// its native handle, a cudaStream_t
inline void *native_stream(const c10::Stream &s) {
#if COLLIE_TORCH2
    return s.native_handle();
#else
    (void)s;
    TORCH_CHECK(false, "collie: CUDA streams need torch 2.x");
#endif
}

} // namespace collie_torch
