// scratch.h — the flat buffers of collie.torch's list-shaped collectives
// (allgather, gather, scatter, reduce_scatter, alltoall and the coalesced
// forms pack a tensor list into one flat tensor, or unpack one).
//
// Design notes
// - Fresh CPU memory of 32 MiB and up comes from mmap (glibc), so a new
//   flat buffer per call paid page faults and the kernel's zeroing on top
//   of the copy: packing two 16 MiB tensors took 30 ms into fresh memory
//   and 1.8 ms into a reused buffer (torch 1.13, this machine). A group
//   keeps up to kKeep CPU buffers of at least kMinBytes and hands one out
//   again once nothing else holds its storage.
// - "Nothing else holds it": the pool hands out views (narrow), never its
//   own tensors, so every user holds the storage; a kept buffer whose
//   storage count is 1 is held by the pool alone. A work keeps its buffers
//   (CollieWork's keep_ and finalize) until collie has completed it, so a
//   buffer is never reused while collie may still read or write it.
// - Memory kept: at most kKeep buffers per process group, each at most
//   twice the size it serves, until the group is destroyed. Smaller
//   buffers and non-CPU ones (torch's CUDA caching allocator already
//   reuses) are plain at::empty.
#pragma once

#include <mutex>
#include <vector>

#include <torch/extension.h>

namespace collie_torch {

class ScratchPool {
  public:
    // An uninitialised 1-D tensor of n elements with `opt`'s dtype and device.
    at::Tensor empty(int64_t n, const at::TensorOptions &opt) {
        if (opt.device().type() != c10::DeviceType::CPU ||
            n * (int64_t)c10::elementSize(c10::typeMetaToScalarType(opt.dtype())) < kMinBytes)
            return at::empty({n}, opt);
        std::lock_guard<std::mutex> g(mu_);
        for (auto &t : kept_)
            if (t.storage().use_count() == 1 && t.dtype() == opt.dtype() && t.numel() >= n &&
                t.numel() <= 2 * n)
                return t.narrow(0, 0, n);
        auto fresh = at::empty({n}, opt);
        if (kept_.size() < kKeep) {
            kept_.push_back(fresh);
        } else {
            for (auto &t : kept_)
                if (t.storage().use_count() == 1) {
                    t = fresh;
                    break;
                }
        }
        return fresh.narrow(0, 0, n);
    }

    // One flat 1-D tensor holding the tensors one after the other.
    at::Tensor flatten(const std::vector<at::Tensor> &ts) {
        TORCH_CHECK(!ts.empty(), "collie: an empty tensor list");
        int64_t n = 0;
        for (auto &t : ts)
            n += t.numel();
        auto flat = empty(n, ts[0].options());
        int64_t off = 0;
        for (auto &t : ts) {
            flat.narrow(0, off, t.numel()).copy_(t.reshape({-1}));
            off += t.numel();
        }
        return flat;
    }

  private:
    static constexpr int64_t kMinBytes = 1 << 20;
    static constexpr size_t kKeep = 4;
    std::mutex mu_;
    std::vector<at::Tensor> kept_;
};

} // namespace collie_torch
