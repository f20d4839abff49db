// cuda_side.h — the CUDA tensors of collie's torch backend (torch 2.x):
// a second collie comm on the NCCL plugin, posts on torch's current stream.
// Included by process_group_collie.cpp after CollieWork and the Completer
// (it completes CUDA works through the same queue and in-flight map).
//
// Design notes
// - Routing: an op whose tensors are CUDA goes to the group's CUDA-side
//   comm (backend "nccl"), every other op to the CPU comm made at creation.
//   One op may not mix devices (check_devices). torch 1.13's backend keeps
//   refusing CUDA tensors (check_tensor), so nothing here runs there.
// - Lazy start: the CUDA comm is made at the group's first CUDA op, as
//   ProcessGroupNCCL makes its communicator: collective by torch's rule that
//   every rank posts the same ops in the same order. collie.torch hands the
//   group a Python factory (set_factory); the first CUDA op calls it with
//   the GIL and the tensor's device index, and gets an owned comm handle.
//   A group whose device map names collie for "cuda" thus works on a
//   machine without a GPU until a CUDA tensor is used. A failed start is
//   kept: every later CUDA op fails naming it (a retry would be a collective
//   that the other ranks do not make). One CUDA device per group.
// - Streams (as ProcessGroupNCCL): a collective is enqueued on torch's
//   current stream of the tensor's device (the plugin's internal stream
//   waits for it); Work::wait() makes the waiter's current stream wait
//   (collie_work_wait_stream) without blocking the host and throws only for
//   a work that already failed; isCompleted() and the future complete when
//   the GPU has finished. The work holds its tensors until then, so the
//   caching allocator cannot reuse them while NCCL reads or writes them.
// - A barrier on a CUDA device (device_ids, or the device torch 2.x puts in
//   BarrierOptions: compat.h's barrier_device) runs on the CUDA side after
//   the collectives posted there, and its wait() blocks the host until the
//   GPU has passed it, as ProcessGroupNCCL's does; any other barrier is the
//   CPU comm's.
// - List-shaped ops (allgather into a list, gather, alltoall, the coalesced
//   forms) unpack their flat buffer on the posting stream right after the
//   collective: the stream waits for the work (no overlap of that stream's
//   later kernels with the collective for these forms), the copies are
//   enqueued, an event is recorded after them (StreamCopies). wait() blocks
//   the waiter's stream on that event; the future is completed once the
//   event has passed (bounded poll on the completer thread).
// - The factory is a Python object: it is dropped with the GIL after its one
//   call, or by the destructor (with the GIL unless Python is finalizing,
//   when it is left to the process's exit).
#pragma once

#include <c10/core/Event.h>

#include <chrono>
#include <thread>

#include "collie_cuda.h"

namespace collie_torch {

// The copies of a list-shaped CUDA op (see the notes): `done` is recorded
// after them on the posting stream; `posted` once post_cuda is through.
struct StreamCopies {
    std::mutex mu;
    std::condition_variable cv;
    bool posted = false;
    std::unique_ptr<c10::Event> done;

    // On the completer: the copies have run (bounded), else throws.
    void wait_done() {
        auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        {
            std::unique_lock<std::mutex> g(mu);
            TORCH_CHECK(cv.wait_until(g, until, [this] { return posted; }),
                        "collie: the post of a CUDA work did not finish within 30 s");
        }
        if (!done) return;
        while (!done->query()) {
            TORCH_CHECK(std::chrono::steady_clock::now() < until,
                        "collie: the copies after a CUDA collective did not finish within 30 s");
            std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
    }
    void set_posted() {
        std::lock_guard<std::mutex> g(mu);
        posted = true;
        cv.notify_all();
    }
};

inline void CollieWork::on_stream(c10::Device dev, std::shared_ptr<StreamCopies> copies) {
    device_ = dev;
    copies_ = std::move(copies);
}

inline bool CollieWork::wait_on_stream() {
    auto rethrow = [this] {
        std::unique_lock<std::mutex> lock(mutex_);
        if (exception_) std::rethrow_exception(exception_);
    };
    if (collie_work_test(w_)) {
        complete(w_);
        rethrow();
    }
    auto s = current_stream(device_);
    int st = collie_work_wait_stream(w_, (collie_cuda_stream_t)native_stream(s));
    if (st != COLLIE_OK) {
        if (collie_work_test(w_)) {
            complete(w_);
            rethrow();
        }
        TORCH_CHECK(false, collie_error(st, "wait on the current CUDA stream"));
    }
    if (copies_ && copies_->done) copies_->done->block(s);
    return true;
}

inline bool on_cuda(const at::Tensor &t) { return COLLIE_TORCH2 && t.defined() && t.is_cuda(); }

// Every tensor of one op on `dev`: a CPU op reads and writes host memory
// only, a CUDA op one device's memory.
inline void check_devices(const Tensors &a, const Tensors &b, const c10::Device &dev,
                          const char *what) {
    for (auto *list : {&a, &b})
        for (auto &t : *list)
            TORCH_CHECK(!t.defined() || t.device() == dev, "collie: ", what,
                        ": all tensors of one op must be on one device (", dev, " and ", t.device(),
                        ")");
}

using CudaFn = std::function<int(collie_comm *, collie_cuda_stream_t, const collie_post_opts *,
                                 collie_work **)>;

class CudaSide {
  public:
    ~CudaSide() { drop_factory(); }

    // with the GIL, once, from collie.torch's creator before the group is
    // anyone else's (no lock: comm_for takes the GIL under mu_)
    void set_factory(py::object f) {
        Py_XDECREF(factory_);
        factory_ = f.release().ptr();
    }
    // the CUDA comm, 0 until the first CUDA op started it (or after teardown)
    uintptr_t handle() const { return reinterpret_cast<uintptr_t>(comm_.load()); }

    // The comm for an op on `dev`, started on first use (collective).
    collie_comm *comm_for(const c10::Device &dev, const char *what) {
        std::lock_guard<std::mutex> g(mu_);
        if (collie_comm *c = comm_.load()) {
            TORCH_CHECK(dev.index() == dev_, "collie: ", what, ": this group's CUDA side runs on ",
                        c10::Device(c10::DeviceType::CUDA, dev_),
                        " (one device per process group), got a tensor on ", dev);
            return c;
        }
        TORCH_CHECK(closed_.empty(), "collie: ", what, ": ", closed_);
        TORCH_CHECK(failed_.empty(), "collie: ", what, ": ", failed_);
        TORCH_CHECK(factory_, "collie: ", what,
                    ": this process group has no CUDA side (made without collie.torch's "
                    "creator, or on torch 1.x)");
        uintptr_t h = 0;
        {
            py::gil_scoped_acquire gil;
            try {
                auto f = py::reinterpret_steal<py::object>(factory_);
                factory_ = nullptr; // one call: a later op fails naming failed_
                h = f((int)dev.index()).cast<uintptr_t>();
            } catch (py::error_already_set &e) {
                failed_ = std::string("the process group's CUDA side (collie's NCCL plugin) did "
                                      "not start on ") +
                          dev.str() + ": " +
                          py::str(e.type().attr("__name__")).cast<std::string>() + ": " +
                          py::str(e.value()).cast<std::string>();
            }
        }
        TORCH_CHECK(failed_.empty(), "collie: ", what, ": ", failed_);
        TORCH_CHECK(h != 0, "collie: ", what, ": the CUDA side's factory returned no comm");
        dev_ = dev.index();
        comm_.store(reinterpret_cast<collie_comm *>(h));
        return comm_.load();
    }

    // collie's abort(reason) (Python), under the group's comm_mu_ (shared)
    void abort(const char *reason) {
        if (collie_comm *c = comm_.load()) collie_comm_abort(c, reason);
    }

    // As ProcessGroupCollie::teardown, for the CUDA comm (if it was started).
    void teardown(const char *reason, bool always_abort) {
        std::lock_guard<std::mutex> g(mu_);
        closed_ = reason;
        collie_comm *c = comm_.exchange(nullptr);
        if (!c) return;
        collie_comm_stats st{};
        st.size = sizeof st;
        if (always_abort || (collie_comm_get_stats(c, &st) == COLLIE_OK && st.in_flight > 0))
            collie_comm_abort(c, reason);
        collie_comm_destroy(c);
    }

  private:
    void drop_factory() {
        if (!factory_) return;
        if (Py_IsInitialized() && PyGILState_Check()) {
            Py_DECREF(factory_);
        } else if (Py_IsInitialized() && !python_finalizing()) {
            py::gil_scoped_acquire gil;
            Py_DECREF(factory_);
        } // else Python is going away: left to the exit
        factory_ = nullptr;
    }
    static bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
        return Py_IsFinalizing();
#else
        return _Py_IsFinalizing();
#endif
    }

    std::mutex mu_;               // the start and teardown
    PyObject *factory_ = nullptr; // a reference (not py::object: hidden visibility)
    std::atomic<collie_comm *> comm_{nullptr};
    c10::DeviceIndex dev_ = -1;
    std::string failed_; // why the start failed
    std::string closed_; // why the comm is gone (teardown)
};

// Posts one CUDA op on torch's current stream of `dev` (see the notes);
// `unpack` (list-shaped ops) copies the flat buffer out on that stream.
inline c10::intrusive_ptr<c10d::Work>
post_cuda_work(CompleterState &cs, int rank, collie_comm *comm, OpType type, const char *what,
               const c10::Device &dev, Tensors outputs, Tensors keep, std::chrono::milliseconds t,
               const CudaFn &fn, std::function<void()> unpack) {
    check_devices(outputs, keep, dev, what);
    auto stream = current_stream(dev);
    auto sh = (collie_cuda_stream_t)native_stream(stream);
    std::shared_ptr<StreamCopies> copies;
    std::function<void()> finalize;
    if (unpack) {
        copies = std::make_shared<StreamCopies>();
        finalize = [copies] { copies->wait_done(); };
    }
    auto work = c10::make_intrusive<CollieWork>(rank, type, std::move(outputs), std::move(keep),
                                                std::move(finalize));
    work->on_stream(dev, copies);
    collie_work *w =
        cs.post(work, timeout_ms(t), what, [&](auto o, auto out) { return fn(comm, sh, o, out); });
    work->attach(w);
    if (copies) {
        // the stream waits for the collective, then unpacks; a work that
        // failed is not unpacked (its future carries the error)
        if (collie_work_wait_stream(w, sh) == COLLIE_OK) {
            try {
                unpack();
                copies->done = std::make_unique<c10::Event>(c10::DeviceType::CUDA);
                copies->done->record(stream);
            } catch (...) {
                copies->set_posted();
                throw;
            }
        }
        copies->set_posted();
    }
    return work;
}

} // namespace collie_torch
