// process_group_collie.cpp — torch's c10d backend over a collie comm: a
// c10d::ProcessGroup on torch 1.13, a c10d::Backend on torch 2.x.
//
// Design notes
// - The only C++ in collie's torch backend: what torch demands (a
//   ProcessGroup or Backend subclass and its Work), with its headers:
//   compat.h (the torch versions), scratch.h (flat buffers) and
//   cuda_side.h (CUDA tensors on torch 2.x: a second comm on the NCCL
//   plugin). Rendezvous, options and policy are Python
//   (collie/torch/__init__.py), collectives are libcollie.
// - One source for both torch versions: what differs is in compat.h
//   (the base class, COLLIE_TORCH2 for the members only 2.x declares).
// - Each torch call posts one collie collective on the caller's thread and
//   returns a CollieWork. Collectives whose torch shape is a tensor list
//   (allgather, gather, scatter, reduce_scatter, alltoall, the coalesced
//   forms) go through one flat buffer: packed at post, unpacked once the work
//   has completed ("finalize"); large CPU ones are reused (scratch.h).
// - Completion is taken in exactly one place per work (std::call_once): by
//   the caller in wait()/isCompleted() when it sees the work done, else by
//   the process's completer thread, which pops every work from a collie
//   completion queue. torch's future callbacks (DDP's among them) therefore
//   run on the waiter or the completer, never on collie's progress thread.
//   A callback may block (it waits for another work's future, which only
//   a completer completes): so two threads pop the queue, and while every
//   one is inside a completion, the next one to start a completion first
//   starts another (at most kCompleters in all; past two, one idle for a
//   second leaves), so a chain of futures never waits on itself.
// - The completer's in-flight map (keyed by the post's tag, recorded before
//   the post) holds each CollieWork (and so its tensors) until collie has
//   completed it: a Work dropped in flight cannot free memory collie still
//   writes.
// - Python exit: the completer thread must not take the GIL once Python
//   finalizes (it would be ended by pthread_exit inside a noexcept
//   destructor: std::terminate). collie.torch's atexit hook stops it first;
//   whatever completes later (groups garbage-collected at exit abort their
//   works) is finished on the thread that drops the last group.
// - The comm's lifetime: torch 2.x's shutdown()/abort() or the destructor
//   tear it down once (teardown()); posts hold comm_mu_ shared, so a post
//   after the teardown fails naming why, never touching a freed comm.
// - torch's profiler sees each operation as gloo's: c10d::Work records an
//   async "collie:<op>" event (gloo's op names) from the post to finish().
// - wait(timeout) is gloo's (torch 1.13's c10d::Work::wait): a finite timeout
//   that passes throws "Operation timed out!" and the operation goes on; with
//   no timeout the wait is still bounded by the collective's own deadline
//   (the process group's timeout, or the op's). A work whose deadline passed
//   fails as gloo's does: "Timed out waiting <ms>ms for <op>: <collie's
//   report>" (torch's suite matches "Timed out").
// - monitoredBarrier is gloo's protocol (tokens to rank 0, its reply) on
//   collie send/recv with tags above every torch tag; it blocks the caller
//   (as gloo's), so its works skip the completer. Rank 0's reply carries its
//   report, so no rank waits out its own deadline after rank 0 has failed.
// - Coalescing (torch 2.x) posts each op as it comes and returns one Work
//   for them at endCoalescing (posting at once cannot deadlock in collie);
//   torch may leave a region without endCoalescing, so startCoalescing
//   starts over and an op collie refuses ends its region. split is one
//   collie_comm_split for every new group; teardown aborts the comm before
//   taking comm_mu_ when a split is in flight, which ends the split.
// - Shrink (torch 2.x where torch declares Backend::shrink: compat.h's
//   ShrinkBase): torch's shrink_group names the ranks to exclude, collie's
//   survivors agree on them (collie_comm_shrink). shrink_agree runs the
//   agreement once and keeps the comm it made (shrunk_, under shrink_mu_,
//   which is taken before comm_mu_); shrink_to hands it to a new
//   ProcessGroupCollie when torch's list is the agreed set, else refuses
//   naming both and keeps it, so a call with the agreed list (what
//   collie.torch.shrink makes) still gets it. A comm nobody took goes with
//   the teardown. lost_ranks() (peer health and the comm's fault) lets
//   collie.torch refuse a new group that names a rank known gone.
#include <torch/extension.h>

#include <pybind11/chrono.h>

#include <pthread.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "collie.h"
#include "compat.h"
#include "scratch.h"

namespace collie_torch {

using c10d::OpType;
using Tensors = std::vector<at::Tensor>;

[[noreturn]] void unsupported(const std::string &what) {
    TORCH_CHECK(false, "not supported by collie: ", what);
}

std::string collie_error(int status, const char *what) {
    const char *msg = collie_last_error();
    return std::string("collie: ") + what + ": " + (msg && *msg ? msg : collie_strerror(status)) +
           " (" + collie_status_name(status) + ")";
}

collie_dtype to_dtype(const at::Tensor &t, const char *op, bool reduction) {
    switch (t.scalar_type()) {
    case at::kChar: return COLLIE_INT8;
    case at::kByte: return COLLIE_UINT8;
    case at::kInt: return COLLIE_INT32;
    case at::kLong: return COLLIE_INT64;
    case at::kHalf: return COLLIE_FP16;
    case at::kBFloat16: return COLLIE_BF16;
    case at::kFloat: return COLLIE_FP32;
    case at::kDouble: return COLLIE_FP64;
    case at::kBool:
        if (!reduction) return COLLIE_UINT8; // moved as bytes
        break;
    default: break;
    }
    unsupported(std::string(op) + " of " + c10::toString(t.scalar_type()) + " tensors");
}

collie_redop to_redop(const c10d::ReduceOp &op, const at::Tensor &t, const char *what) {
    bool is_bool = t.scalar_type() == at::kBool;
    switch (op) {
    case c10d::ReduceOp::SUM:
        if (!is_bool) return COLLIE_SUM;
        break;
    case c10d::ReduceOp::PRODUCT:
        if (!is_bool) return COLLIE_PROD;
        break;
    case c10d::ReduceOp::MIN: return COLLIE_MIN;
    case c10d::ReduceOp::MAX: return COLLIE_MAX;
    case c10d::ReduceOp::AVG:
        if (!is_bool) return COLLIE_AVG;
        break;
    case c10d::ReduceOp::BAND: unsupported(std::string(what) + " with ReduceOp.BAND (bitwise)");
    case c10d::ReduceOp::BOR: unsupported(std::string(what) + " with ReduceOp.BOR (bitwise)");
    case c10d::ReduceOp::BXOR: unsupported(std::string(what) + " with ReduceOp.BXOR (bitwise)");
    default: unsupported(std::string(what) + " with this ReduceOp (PREMUL_SUM)");
    }
    unsupported(std::string(what) + " of bool tensors with this ReduceOp (only MIN and MAX)");
}

void check_tensor(const at::Tensor &t, const char *op) {
    if (t.is_sparse()) unsupported(std::string(op) + " of sparse tensors");
    if (t.is_complex()) unsupported(std::string(op) + " of complex tensors");
#if COLLIE_TORCH2
    TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(), "collie: ", op,
                ": the torch backend takes CPU and CUDA tensors, got a tensor on ", t.device());
#else
    TORCH_CHECK(t.device().is_cpu(), "collie: ", op,
                ": the torch backend takes CPU tensors (CUDA tensors go through the collie "
                "package's cuda_* calls), got a tensor on ",
                t.device());
#endif
    TORCH_CHECK(t.is_contiguous(), "collie: ", op, ": tensors must be contiguous");
}

const at::Tensor &single(const Tensors &ts, const char *op) {
    TORCH_CHECK(ts.size() == 1, "collie: ", op, " takes one tensor per process, got ", ts.size());
    check_tensor(ts[0], op);
    return ts[0];
}

void same_kind(const at::Tensor &a, const at::Tensor &b, const char *op) {
    TORCH_CHECK(a.scalar_type() == b.scalar_type(), "collie: ", op,
                ": tensors of different types (", a.scalar_type(), " and ", b.scalar_type(), ")");
}

int32_t timeout_ms(std::chrono::milliseconds t) {
    if (t == c10d::kUnsetTimeout) return COLLIE_TIMEOUT_DEFAULT;
    if (t.count() <= 0) return 1;
    return t.count() > INT32_MAX ? COLLIE_TIMEOUT_INFINITE : (int32_t)t.count();
}

// A failed work's error: collie's sentence and status name; a deadline
// that passed reads as gloo's ("Timed out waiting 1000ms for barrier: ..."),
// which torch's suite matches (" (Timed out|closed|timeout) ").
std::string work_error(const collie_work *w, int st) {
    std::string msg = collie_work_error_message(w);
    std::string head = "collie: ";
    collie_work_details d{};
    if (st == COLLIE_ETIMEDOUT && collie_work_info(w, &d) == COLLIE_OK)
        head += "Timed out waiting " + std::to_string(d.timeout_ms) + "ms for " +
                (d.op ? d.op : "the operation") + ": ";
    return head + msg + " (" + collie_status_name(st) + ")";
}

class CollieWork;
struct StreamCopies; // cuda_side.h

// One per process: takes completions off a collie queue (see the notes).
// The thread owns the queue and the in-flight map (CompleterState), so the
// last process group may let go of the Completer from anywhere, even from
// a future callback running on the completer's own thread.
struct CompleterState : std::enable_shared_from_this<CompleterState> {
    static constexpr int kCompleters = 16;
    collie_cq *cq = nullptr;
    std::atomic<bool> stop{false};
    std::atomic<int> threads{0}; // popping the queue: the first and its helpers
    std::atomic<int> busy{0};    // of them, inside a completion (its callbacks)
    std::mutex live_mu;          // helpers' count, for shutdown's bounded wait
    std::condition_variable live_cv;
    int helpers = 0;
    bool first_done = false; // the first thread has left its loop
    std::mutex mu; // guards inflight only (never held while calling collie)
    uint64_t next_key = 0;
    // post tag -> the work, recorded before the post so the completer finds it
    std::unordered_map<uint64_t, c10::intrusive_ptr<CollieWork>> inflight;
    ~CompleterState() { collie_cq_destroy(cq); }
    // Posts through fn(opts, &w) with this queue and a fresh tag, `work`
    // recorded in flight first (the completer may pop it before fn
    // returns); a refused post is undone and thrown as collie's error.
    template <class Fn>
    collie_work *post(const c10::intrusive_ptr<CollieWork> &work, int32_t timeout_ms,
                      const char *what, Fn &&fn);
};

class Completer {
  public:
    static std::shared_ptr<Completer> acquire() {
        std::lock_guard<std::mutex> g(registry_mu());
        auto c = current().lock();
        if (!c || c->state_->stop.load() || c->forks_ != forks().load()) {
            c = std::shared_ptr<Completer>(new Completer());
            current() = c;
        }
        return c;
    }
    // Python's atexit (collie.torch registers it, the GIL released): stop
    // the thread while it may still take the GIL. Past this point Python
    // finalizes, and a thread taking the GIL then is ended by pthread_exit
    // (dropping the last reference of a tensor Python let go of takes it).
    static void at_exit() {
        std::shared_ptr<Completer> c;
        {
            std::lock_guard<std::mutex> g(registry_mu());
            c = current().lock();
        }
        if (c) c->shutdown();
    }
    ~Completer() {
        shutdown();
        if (forks_ == forks().load())
            drain(*state_); // what completed since, on this (the last group's) thread
    }
    CompleterState &state() { return *state_; }

  private:
    // fork() children of this process: a Completer made before the fork
    // has no threads in the child, which makes its own (acquire) and
    // leaves the old one as it is (its threads cannot be joined there)
    static std::atomic<unsigned> &forks() {
        static std::atomic<unsigned> n{0};
        static std::once_flag once;
        std::call_once(once, [] { pthread_atfork(nullptr, nullptr, [] { forks()++; }); });
        return n;
    }
    const unsigned forks_ = forks().load();
    Completer() : state_(std::make_shared<CompleterState>()) {
        int st = collie_cq_create(&state_->cq);
        TORCH_CHECK(st == COLLIE_OK, collie_error(st, "completion queue"));
        state_->threads = 1;
        thread_ = std::thread([s = state_] {
            pthread_setname_np(pthread_self(), "collie-futures");
            in_completer() = true;
            while (!s->stop.load())
                pop_one(*s, 50);
            std::lock_guard<std::mutex> g(s->live_mu);
            s->first_done = true;
            s->live_cv.notify_all();
        });
        add_helper(*state_); // the standby
    }
    // Another thread popping the queue: the standby, and more while every
    // one is in a completion (the notes); past two, one leaves after a
    // second without work; all at stop.
    static void add_helper(CompleterState &s) {
        int n = s.threads.load();
        do {
            if (n >= CompleterState::kCompleters || s.stop.load()) return;
        } while (!s.threads.compare_exchange_weak(n, n + 1));
        {
            std::lock_guard<std::mutex> g(s.live_mu);
            s.helpers++;
        }
        std::thread([sp = s.shared_from_this()] {
            pthread_setname_np(pthread_self(), "collie-futures");
            in_completer() = true;
            bool left = false;
            for (int idle_ms = 0; !left && !sp->stop.load();) {
                idle_ms = pop_one(*sp, 50) ? 0 : idle_ms + 50;
                int n = sp->threads.load();
                left = idle_ms >= 1000 && n > 2 && sp->threads.compare_exchange_strong(n, n - 1);
                // a completion that counted this thread as a popper as it
                // left (busy then threads, seq_cst): stay instead
                if (left && sp->busy.load() >= sp->threads.load()) {
                    sp->threads++;
                    left = false;
                    idle_ms = 0;
                }
            }
            if (!left) sp->threads--;
            std::lock_guard<std::mutex> g(sp->live_mu);
            sp->helpers--;
            sp->live_cv.notify_all();
        }).detach();
    }
    static std::mutex &registry_mu() {
        static std::mutex mu;
        return mu;
    }
    static std::weak_ptr<Completer> &current() {
        static std::weak_ptr<Completer> c;
        return c;
    }
    // Stops the thread. A caller holding the GIL lets go of it while it
    // joins: the thread may need the GIL to finish the work in its hands.
    void shutdown() {
        std::call_once(shutdown_once_, [this] {
            state_->stop.store(true);
            if (forks_ != forks().load()) {
                new std::thread(std::move(thread_)); // the parent's: left, never joined
            } else if (in_completer()) {
                thread_.detach(); // the last group let go from a callback: no waiting on itself
            } else if (Py_IsInitialized() && PyGILState_Check()) {
                py::gil_scoped_release nogil;
                join_bounded();
            } else {
                join_bounded();
            }
        });
    }
    // every completer thread sees stop within a pop (50 ms); one inside a
    // callback that does not return within 5 s is left (detached), never
    // waited for without end
    void join_bounded() {
        std::unique_lock<std::mutex> g(state_->live_mu);
        state_->live_cv.wait_for(g, std::chrono::seconds(5), [this] {
            return state_->first_done && state_->helpers == 0;
        });
        bool left_loop = state_->first_done;
        g.unlock();
        if (left_loop)
            thread_.join(); // it has left its loop: at once
        else
            thread_.detach();
    }
    // true on the completer's threads (a callback may drop the last group)
    static bool &in_completer() {
        thread_local bool on = false;
        return on;
    }
    static bool pop_one(CompleterState &s, int32_t ms);
    static void drain(CompleterState &s) {
        while (pop_one(s, 0)) {
        }
    }
    std::shared_ptr<CompleterState> state_;
    std::thread thread_;
    std::once_flag shutdown_once_;
};

// The name of an operation's event in torch's profiler: gloo's names with
// "collie:" first (torch's suite looks for "<backend>:all_reduce" etc.).
// c10d::Work records the event from the post to finish() when the profiler
// runs; the in-place operations record their tensors (record_shapes).
const char *profiling_title(OpType type) {
    switch (type) {
    case OpType::BROADCAST: return "collie:broadcast";
    case OpType::ALLREDUCE:
    case OpType::ALLREDUCE_COALESCED: return "collie:all_reduce";
    case OpType::REDUCE: return "collie:reduce";
    case OpType::ALLGATHER:
    case OpType::_ALLGATHER_BASE:
    case OpType::ALLGATHER_COALESCED: return "collie:all_gather";
    case OpType::GATHER: return "collie:gather";
    case OpType::SCATTER: return "collie:scatter";
    case OpType::REDUCE_SCATTER:
    case OpType::_REDUCE_SCATTER_BASE: return "collie:reduce_scatter";
    case OpType::ALLTOALL:
    case OpType::ALLTOALL_BASE: return "collie:all_to_all";
    case OpType::SEND: return "collie:send";
    case OpType::RECV: return "collie:recv";
    case OpType::RECVANYSOURCE: return "collie:recvAnySource";
    case OpType::BARRIER: return "collie:barrier";
    default: return "collie:coalesced";
    }
}

// The tensors an operation's profiler event records when its caller names
// none: a send's tensor, the in-place operations' and receives' outputs.
OptionalTensors profiled_inputs(OpType type, const Tensors &outputs, const Tensors &keep) {
    switch (type) {
    case OpType::SEND: return keep;
    case OpType::BROADCAST:
    case OpType::ALLREDUCE:
    case OpType::ALLREDUCE_COALESCED:
    case OpType::REDUCE:
    case OpType::RECV:
    case OpType::RECVANYSOURCE: return outputs;
    default: return OptionalTensors();
    }
}

class CollieWork : public c10d::Work {
  public:
    CollieWork(int rank, OpType type, Tensors outputs, std::vector<at::Tensor> keep,
               std::function<void()> finalize, const OptionalTensors &inputs = OptionalTensors())
        : c10d::Work(rank, type, profiling_title(type),
                     inputs ? inputs : profiled_inputs(type, outputs, keep)),
          outputs_(std::move(outputs)), keep_(std::move(keep)), finalize_(std::move(finalize)),
          future_(c10::make_intrusive<c10::ivalue::Future>(
              c10::ListType::create(c10::TensorType::get()))) {}
    ~CollieWork() override { collie_work_release(w_); }

    void attach(collie_work *w) { w_ = w; }

    // Exactly once, by whoever first sees collie's completion of `w` (the
    // completer may see it before attach() has run on the posting thread).
    void complete(collie_work *w) {
        std::call_once(once_, [this, w] {
            int st = collie_work_result(w);
            std::exception_ptr err;
            if (st == COLLIE_OK) {
                try {
                    if (finalize_) finalize_();
                } catch (...) {
                    err = std::current_exception();
                }
            } else {
                err = std::make_exception_ptr(std::runtime_error(work_error(w, st)));
            }
            finalize_ = nullptr;
            keep_.clear();
            if (err) {
                future_->setError(err);
                finish(err);
            } else {
                future_->markCompleted(c10::IValue(outputs_));
                finish();
            }
        });
    }

    bool isCompleted() override {
        if (collie_work_test(w_)) complete(w_);
        return c10d::Work::isCompleted();
    }

    bool wait(std::chrono::milliseconds timeout) override {
        if (device_.is_cuda() && retrieveOpType() != OpType::BARRIER) return wait_on_stream();
        int32_t ms = COLLIE_TIMEOUT_INFINITE;
        if (timeout != kNoTimeout)
            ms = timeout.count() > INT32_MAX ? INT32_MAX
                                             : (int32_t)std::max<int64_t>(0, timeout.count());
        int st = collie_work_wait(w_, ms);
        if (st == COLLIE_INPROGRESS) TORCH_CHECK(false, "Operation timed out!");
        complete(w_);
        std::unique_lock<std::mutex> lock(mutex_);
        if (exception_) std::rethrow_exception(exception_);
        return true;
    }

    void abort() override { collie_work_cancel(w_); }
    // CUDA works (cuda_side.h): wait() makes the current stream wait
    void on_stream(c10::Device dev, std::shared_ptr<StreamCopies> copies);
    bool wait_on_stream();
    // the sender of a receive (recv without src: recvAnysource)
    int sourceRank() const override { return collie_work_source(w_); }
    std::vector<at::Tensor> result() override { return outputs_; }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  private:
    collie_work *w_ = nullptr;
    Tensors outputs_;
    std::vector<at::Tensor> keep_; // inputs and flat buffers, until completion
    std::function<void()> finalize_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
    std::once_flag once_;
    c10::Device device_{c10::DeviceType::CPU};
    std::shared_ptr<StreamCopies> copies_;
};

template <class Fn>
collie_work *CompleterState::post(const c10::intrusive_ptr<CollieWork> &work, int32_t timeout_ms,
                                  const char *what, Fn &&fn) {
    collie_post_opts o = COLLIE_POST_OPTS_INIT;
    o.timeout_ms = timeout_ms;
    o.cq = cq;
    {
        std::lock_guard<std::mutex> g(mu);
        o.tag = ++next_key;
        inflight.emplace(o.tag, work);
    }
    collie_work *w = nullptr;
    int st = fn(&o, &w);
    if (st != COLLIE_OK) {
        std::lock_guard<std::mutex> g(mu);
        inflight.erase(o.tag);
        throw std::runtime_error(collie_error(st, what));
    }
    return w;
}

// Completes one work from the queue (waiting up to `ms`); false if none.
bool Completer::pop_one(CompleterState &s, int32_t ms) {
    collie_work *w = nullptr;
    if (collie_cq_pop(s.cq, ms, &w) != COLLIE_OK) return false;
    c10::intrusive_ptr<CollieWork> cw;
    {
        std::lock_guard<std::mutex> g(s.mu);
        auto it = s.inflight.find(collie_work_tag(w));
        if (it != s.inflight.end()) {
            cw = std::move(it->second);
            s.inflight.erase(it);
        }
    }
    if (cw) {
        // the last idle popper starts a completion: keep one popping
        if (s.busy.fetch_add(1) + 1 >= s.threads.load()) add_helper(s);
        cw->complete(w);
        s.busy.fetch_sub(1);
    }
    collie_work_release(w);
    return true;
}

#if COLLIE_TORCH2
// endCoalescing's Work: the works posted between startCoalescing and
// endCoalescing, as one. Done when every part is; fails with the first
// failing part's error (in post order); its future completes with every
// part's outputs once all parts' futures have.
class CoalescedWork : public c10d::Work {
  public:
    CoalescedWork(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> parts)
        : c10d::Work(rank, OpType::COALESCED), parts_(std::move(parts)),
          future_(c10::make_intrusive<c10::ivalue::Future>(
              c10::ListType::create(c10::TensorType::get()))) {
        for (auto &p : parts_)
            for (auto &t : p->result())
                outputs_.push_back(t);
        auto left = std::make_shared<std::atomic<size_t>>(parts_.size() + 1);
        auto futs = std::make_shared<std::vector<c10::intrusive_ptr<c10::ivalue::Future>>>();
        for (auto &p : parts_)
            futs->push_back(p->getFuture());
        // the last part's callback (or this constructor) completes the whole
        auto done = [left, futs, fut = future_, outs = outputs_]() {
            if (left->fetch_sub(1) != 1) return;
            for (auto &f : *futs)
                if (f->hasError()) return fut->setError(f->exception_ptr());
            fut->markCompleted(c10::IValue(outs));
        };
        for (auto &f : *futs)
            f->addCallback([done](c10::ivalue::Future &) { done(); });
        done();
    }

    bool isCompleted() override {
        for (auto &p : parts_)
            if (!p->isCompleted()) return false;
        return true;
    }

    // each part in post order, within what is left of `timeout`; the first
    // part's error is thrown
    bool wait(std::chrono::milliseconds timeout) override {
        auto end = std::chrono::steady_clock::now() + timeout;
        for (auto &p : parts_) {
            if (timeout == kNoTimeout) {
                p->wait(kNoTimeout);
                continue;
            }
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                end - std::chrono::steady_clock::now());
            TORCH_CHECK(left.count() > 0 || p->isCompleted(), "Operation timed out!");
            p->wait(std::max(left, std::chrono::milliseconds(1)));
        }
        return true;
    }

    void abort() override {
        for (auto &p : parts_)
            p->abort();
    }
    std::vector<at::Tensor> result() override { return outputs_; }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  private:
    std::vector<c10::intrusive_ptr<c10d::Work>> parts_;
    Tensors outputs_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
};
#endif

// Copies a flat buffer back into the tensors it was packed from.
std::function<void()> unpack(at::Tensor flat, Tensors outs) {
    return [flat, outs]() mutable {
        int64_t off = 0;
        for (auto &o : outs) {
            o.copy_(flat.narrow(0, off, o.numel()).view(o.sizes()));
            off += o.numel();
        }
    };
}

} // namespace collie_torch

#include "cuda_side.h"

namespace collie_torch {

class ProcessGroupCollie : public ShrinkBase<ProcessGroupCollie> {
  public:
    // Takes ownership of `comm` (made by collie.torch from the torch store).
    // `timeout`: the comm's default op timeout, for getBackendOptions (unset:
    // learned from the first post that takes the default).
    ProcessGroupCollie(int rank, int size, uintptr_t comm,
                       std::chrono::milliseconds timeout = c10d::kUnsetTimeout)
        : ShrinkBase(rank, size), comm_(reinterpret_cast<collie_comm *>(comm)),
          completer_(Completer::acquire()),
          default_timeout_ms_(timeout == c10d::kUnsetTimeout ? -2 : timeout.count()) {
        TORCH_CHECK(comm_ != nullptr, "collie: no communicator");
    }
    ~ProcessGroupCollie() override { teardown("the process group was destroyed", false); }

    // The ranks this group's comm knows are gone - dead or left (peer
    // health), or in its fault's set when that fault is a death, a
    // departure, or the survivors' agreement - and the comm's error ("" while
    // healthy). collie.torch refuses a new group naming one of them at once
    // (it would wait out its rendezvous). Never blocks.
    std::pair<std::vector<int>, std::string> lost_ranks() {
        std::shared_lock<std::shared_mutex> g(comm_mu_);
        if (!comm_) return {{}, closed_};
        std::vector<collie_peer_health> h(size_);
        std::vector<bool> lost(size_, false);
        int n = collie_comm_health(comm_, h.data(), size_);
        for (int r = 0; r < n; r++)
            lost[r] = h[r].state == COLLIE_PEER_DEAD || h[r].state == COLLIE_PEER_LEFT;
        collie_fault f{};
        f.size = sizeof f;
        if (collie_comm_fault(comm_, &f) == COLLIE_OK && f.status != COLLIE_OK &&
            (f.kind == COLLIE_FAULT_PEER_DEAD || f.kind == COLLIE_FAULT_PEER_LEFT ||
             f.view == COLLIE_FAULT_VIEW_AGREED))
            for (int i = 0; i < std::min(f.nranks, COLLIE_FAULT_RANKS); i++)
                if (f.ranks[i] >= 0 && f.ranks[i] < size_) lost[f.ranks[i]] = true;
        std::vector<int> out;
        for (int r = 0; r < size_; r++)
            if (lost[r]) out.push_back(r);
        int st = COLLIE_OK;
        const char *msg = nullptr;
        collie_comm_error(comm_, &st, &msg);
        return {out, msg ? msg : ""};
    }

    // For a group made by a shrink: each rank of the group it came from,
    // with its rank here or -1 (left out). Empty for any other group.
    std::vector<int> rank_map() {
        std::shared_lock<std::shared_mutex> g(comm_mu_);
        TORCH_CHECK(comm_, "collie: rank_map: ", closed_);
        int n = collie_comm_rank_map(comm_, nullptr, 0);
        if (n == COLLIE_ESTATE) return {};
        TORCH_CHECK(n >= 0, collie_error(n, "rank_map"));
        std::vector<int> map(n);
        int got = collie_comm_rank_map(comm_, map.data(), n);
        TORCH_CHECK(got >= 0, collie_error(got, "rank_map"));
        return map;
    }

#if COLLIE_TORCH2
    // torch 2.x's destroy_process_group: the comm goes now, not when torch
    // lets go of the Backend. Works still in flight fail (EABORTED, naming
    // the shutdown) rather than waiting out their deadlines.
    void shutdown() override {
        teardown("the process group was shut down (destroy_process_group)", false);
    }
    // torch 2.x's abort (_abort_process_group): every pending work fails now.
    void abort() override { teardown("the process group was aborted (torch's abort)", true); }

    // The backend's options: its name and the group's timeout (torch's
    // split_group starts a child's options from them).
    c10::intrusive_ptr<Options> getBackendOptions() override {
        int64_t ms = default_timeout_ms_.load();
        auto t =
            ms == -2 ? kBackendDefaultTimeout : std::chrono::milliseconds(ms < 0 ? INT32_MAX : ms);
        auto o = c10::make_intrusive<Options>("collie", t);
        o->group_name = getGroupUid();
        return o;
    }

    // split_group: every rank of the group calls it with the ranks of its
    // own new group in the new group's order (a rank in none: some other
    // group's); one collie_comm_split makes every new group at once, the
    // colour being a hash of the list (split_colour), the key a rank's
    // position. Ranks given different lists so get different colours, and
    // a comm smaller than the list a rank named is refused, naming it:
    // those of one colour named one list that holds each of them, so a
    // comm of the list's size is that list (only a 31-bit hash collision
    // between two disagreeing lists of one size could fool it).
    // Blocks, bounded by torch's timeout of the new group (split_group's
    // timeout=, which torch passes in `opts`), else the comm's creation
    // timeout; nullptr for a rank in no group. comm_mu_ is held shared
    // across it, so teardown (torch's abort or shutdown from another
    // thread) first aborts the comm, which ends the split at once (collie
    // watches the parent in each wait of a split), then takes comm_mu_.
    bool supportsSplitting() const override { return true; }
    // FNV-1a of the ordered list, as a colour (not negative, never
    // COLLIE_UNDEFINED)
    static int split_colour(const std::vector<int> &ranks) {
        uint64_t h = 1469598103934665603ULL;
        for (int r : ranks)
            for (int b = 0; b < 4; b++)
                h = (h ^ (uint8_t)((uint32_t)r >> (8 * b))) * 1099511628211ULL;
        return (int)((h ^ (h >> 31) ^ (h >> 62)) & 0x7fffffff);
    }
    c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store> &store,
                                            const std::vector<int> &ranks,
                                            const c10::intrusive_ptr<Options> &opts) override {
        auto me = std::find(ranks.begin(), ranks.end(), rank_);
        int color = COLLIE_UNDEFINED, key = 0;
        if (me != ranks.end()) {
            color = split_colour(ranks);
            key = (int)(me - ranks.begin());
        }
        for (int r : ranks)
            TORCH_CHECK(r >= 0 && r < size_, "collie: split: rank ", r, " is not in the group of ",
                        size_);
        collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
        auto t = opts ? opts->timeout : c10d::kUnsetTimeout;
        if (t != c10d::kUnsetTimeout) o.timeout_ms = o.create_timeout_ms = timeout_ms(t);
        collie_comm *child = nullptr;
        int st;
        {
            // splitting_ is raised before tearing_ is read, and teardown
            // does the reverse: one of them sees the other, so a teardown
            // never waits a split out
            ++splitting_;
            struct Done {
                std::atomic<int> &n;
                ~Done() { --n; }
            } done{splitting_};
            std::shared_lock<std::shared_mutex> g(comm_mu_);
            TORCH_CHECK(comm_, "collie: split: ", closed_);
            TORCH_CHECK(!tearing_.load(), "collie: split: the process group is being torn down");
            st = collie_comm_split(comm_, color, key, &o, &child);
        }
        if (st == COLLIE_ENOTMEMBER) return nullptr;
        TORCH_CHECK(st == COLLIE_OK, collie_error(st, "split"));
        if (collie_comm_size(child) != (int)ranks.size()) {
            int got = collie_comm_size(child);
            collie_work *dw = nullptr;
            if (collie_comm_destroy_post(child, nullptr, &dw) == COLLIE_OK) collie_work_release(dw);
            std::string list;
            for (int r : ranks)
                list += (list.empty() ? "" : ", ") + std::to_string(r);
            TORCH_CHECK(false, "collie: split: this rank (", rank_, ") was given the group [", list,
                        "] but ", got, " of its ranks named that list: the ranks were given "
                        "different split_ranks");
        }
        return c10::make_intrusive<ProcessGroupCollie>(collie_comm_rank(child),
                                                       collie_comm_size(child),
                                                       reinterpret_cast<uintptr_t>(child), t);
    }

    // Shrinking (torch's dist.shrink_group -> Backend::shrink where torch
    // declares it: compat.h's ShrinkBase; collie.torch.shrink): the
    // survivors of a fault agree on the ranks that failed
    // (collie_comm_shrink of this group's comm: every work of this comm has
    // ended first) and get a group of the others, renumbered in order.
    // torch names the ranks to exclude up front, collie agrees on them: so
    // shrink_agree runs the agreement once and keeps its comm (shrunk_),
    // returning the ranks it left out, and shrink_to hands that comm over
    // when torch's list is that set, else fails naming both and keeps it
    // for a call with the agreed list. Bounded by `t` (opts' timeout, also
    // the new group's op timeout), else the comm's creation timeout. A
    // healthy comm (no rank dead, left or suspected) is refused (ESTATE)
    // unless shrink_flags has SHRINK_ABORT, which aborts it first. A
    // teardown from another thread waits for a shrink in flight (bounded
    // by its timeout: the comm is failed already, an abort would not end it).
    // abort_first: 1 torch's SHRINK_ABORT, 2 collie.torch.shrink's revoke
    std::vector<int> shrink_agree(std::chrono::milliseconds t, int abort_first) {
        std::lock_guard<std::mutex> sg(shrink_mu_);
        if (!shrunk_) {
            collie_shrink_opts so{};
            so.size = sizeof so;
            collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
            if (t != c10d::kUnsetTimeout) {
                so.timeout_ms = o.timeout_ms = o.create_timeout_ms = timeout_ms(t);
                so.comm = &o;
            }
            collie_comm *child = nullptr;
            int st;
            {
                std::shared_lock<std::shared_mutex> g(comm_mu_);
                TORCH_CHECK(comm_, "collie: shrink: ", closed_);
                if (abort_first)
                    collie_comm_abort(comm_, abort_first == 1
                                                 ? "torch's shrink_group (SHRINK_ABORT)"
                                                 : "collie.torch.shrink: a member is known lost "
                                                   "(the default group's comm saw it)");
                st = collie_comm_shrink(comm_, &so, &child);
            }
            TORCH_CHECK(st != COLLIE_ENOTMEMBER, collie_error(st, "shrink"),
                        ": this process is in no group of the survivors (it rejoins through a "
                        "new init_process_group)");
            TORCH_CHECK(st != COLLIE_ESTATE, collie_error(st, "shrink"),
                        ": collie shrinks a group to the survivors of a fault (a rank dead, left "
                        "or suspected; a group that has not noticed it yet is healthy too: "
                        "torch's shrink_group with SHRINK_ABORT aborts it first)");
            TORCH_CHECK(st == COLLIE_OK, collie_error(st, "shrink"));
            shrunk_ = child;
        }
        std::vector<int> map(size_, -1), left;
        int n = collie_comm_rank_map(shrunk_, map.data(), size_);
        TORCH_CHECK(n >= 0, collie_error(n, "shrink: rank map"));
        for (int r = 0; r < size_; r++)
            if (map[r] < 0) left.push_back(r);
        return left;
    }

    c10::intrusive_ptr<c10d::Backend> shrink_to(const std::vector<int64_t> &exclude, int flags,
                                                const c10::intrusive_ptr<Options> &opts) {
        auto t = opts ? opts->timeout : c10d::kUnsetTimeout;
        auto left = shrink_agree(t, (flags & 1) ? 1 : 0 /* torch's SHRINK_ABORT */);
        std::vector<int> want(exclude.begin(), exclude.end());
        std::sort(want.begin(), want.end());
        TORCH_CHECK(left == want, "collie: shrink: the survivors agreed to leave out ranks ",
                    c10::ArrayRef<int>(left), ", not ", c10::ArrayRef<int>(want),
                    " (ranks_to_exclude): call shrink_group with the agreed ranks, or "
                    "collie.torch.shrink(group), which asks collie for them first");
        collie_comm *child;
        {
            std::lock_guard<std::mutex> sg(shrink_mu_);
            child = shrunk_;
            shrunk_ = nullptr;
        }
        TORCH_CHECK(child, "collie: shrink: another thread took the survivors' group");
        if (t == c10d::kUnsetTimeout && default_timeout_ms_.load() >= 0)
            t = std::chrono::milliseconds(default_timeout_ms_.load());
        return c10::make_intrusive<ProcessGroupCollie>(collie_comm_rank(child),
                                                       collie_comm_size(child),
                                                       reinterpret_cast<uintptr_t>(child), t);
    }

    // Coalescing (torch's _coalescing_manager with a device,
    // batch_isend_irecv): the ops between startCoalescing and endCoalescing
    // are posted as they come (collie's posts never block, and its
    // send/recv match outside the collective order, so posting at once
    // cannot deadlock; torch also waits on a synchronous op's own Work
    // inside the manager); endCoalescing returns one Work for all of them.
    // A region torch left without endCoalescing (its _coalescing_manager has
    // no try/finally: an op that raised, or torch's own "mixed types" check
    // after the body) is dropped by the next startCoalescing, as NCCL's
    // does: its works complete as usual, no Work is made of them. An op
    // collie refuses inside a region (it throws: RefusalGuard) ends the
    // region, so the ops after it are not kept for a Work nobody gets.
    bool supportsCoalescing() const override { return true; }
    void startCoalescing() override {
        std::lock_guard<std::mutex> g(coalesce_mu_);
        coalesced_.clear();
        refused_.clear();
        coalescing_ = true;
    }
    c10::intrusive_ptr<c10d::Work> endCoalescing() override {
        std::vector<c10::intrusive_ptr<c10d::Work>> parts;
        {
            std::lock_guard<std::mutex> g(coalesce_mu_);
            TORCH_CHECK(coalescing_.load() || !refused_.empty(),
                        "collie: endCoalescing without startCoalescing");
            TORCH_CHECK(coalescing_.load(),
                        "collie: endCoalescing: the coalescing region ended "
                        "at the ",
                        refused_, " collie refused (its error was raised then)");
            coalescing_ = false;
            parts.swap(coalesced_);
        }
        return c10::make_intrusive<CoalescedWork>(rank_, std::move(parts));
    }

    // gather_single / gather_into_tensor: rank r's input lands at block r of
    // the root's one output tensor (other ranks pass an empty one).
    // (compat.h's GatherBase: where torch declares gather_into_tensor)
    c10::intrusive_ptr<c10d::Work> gather_into_tensor_impl(at::Tensor &out, at::Tensor &in,
                                                           const c10d::GatherOptions &opts) {
        RefusalGuard refusal(*this, "gather_into_tensor");
        const char *op = "gather_into_tensor";
        check_tensor(in, op);
        auto dt = to_dtype(in, op, false);
        int root = (int)opts.rootRank;
        bool is_root = rank_ == root;
        if (is_root) {
            check_tensor(out, op);
            same_kind(in, out, op);
            TORCH_CHECK(out.numel() == size_ * in.numel(), "collie: ", op, ": the output holds ",
                        out.numel(), " elements, expected ", size_ * in.numel());
        }
        return post(OpType::GATHER, op, is_root ? Tensors{out} : Tensors{}, {in}, opts.timeout,
                    [&](auto o, auto w) {
                        return collie_gather(comm_, in.data_ptr(),
                                             is_root ? out.data_ptr() : nullptr, in.numel(), dt,
                                             root, o, w);
                    });
    }
#endif

    const std::string getBackendName() const override { return "collie"; }

    // The group's sequence number: operations posted through it. Every rank
    // of a new group starts at 0, so there is nothing to agree on.
    void setSequenceNumberForGroup() override { seq_ = 0; }
    uint64_t getSequenceNumberForGroup() override { return seq_; }
    // 0 once the comm was torn down (shutdown, abort)
    uintptr_t comm_handle() {
        std::shared_lock<std::shared_mutex> g(comm_mu_);
        return reinterpret_cast<uintptr_t>(comm_);
    }

    using PostFn = std::function<int(const collie_post_opts *, collie_work **)>;

    c10::intrusive_ptr<c10d::Work> post(OpType type, const char *what, Tensors outputs,
                                        std::vector<at::Tensor> keep, std::chrono::milliseconds t,
                                        const PostFn &fn, std::function<void()> finalize = nullptr,
                                        const OptionalTensors &inputs = OptionalTensors()) {
        std::shared_lock<std::shared_mutex> live(comm_mu_);
        TORCH_CHECK(comm_ != nullptr, "collie: ", what, ": ", closed_);
        check_devices(outputs, keep, c10::Device(c10::DeviceType::CPU), what);
        auto work = c10::make_intrusive<CollieWork>(rank_, type, std::move(outputs),
                                                    std::move(keep), std::move(finalize), inputs);
        collie_work *w = completer_->state().post(work, timeout_ms(t), what, fn);
        ++seq_;
        work->attach(w);
        note_coalesced(work);
        collie_work_details d{};
        if (t == c10d::kUnsetTimeout && default_timeout_ms_.load() == -2 &&
            collie_work_info(w, &d) == COLLIE_OK)
            default_timeout_ms_ = d.timeout_ms;
        return work;
    }

    // An op on CUDA tensors (cuda_side.h): posted on the CUDA side's comm,
    // started by the group's first CUDA op, on torch's current stream of
    // `on`'s device; `unpack` copies a flat buffer out on that stream.
    c10::intrusive_ptr<c10d::Work> post_cuda(OpType type, const char *what, const c10::Device &on,
                                             Tensors outputs, std::vector<at::Tensor> keep,
                                             std::chrono::milliseconds t, const CudaFn &fn,
                                             std::function<void()> unpack = nullptr) {
        std::shared_lock<std::shared_mutex> live(comm_mu_);
        TORCH_CHECK(comm_ != nullptr, "collie: ", what, ": ", closed_);
        collie_comm *c = cuda_.comm_for(on, what);
        auto work = post_cuda_work(completer_->state(), rank_, c, type, what, on,
                                   std::move(outputs), std::move(keep), t, fn, std::move(unpack));
        ++seq_;
        note_coalesced(work);
        return work;
    }
    // between startCoalescing and endCoalescing, endCoalescing's Work waits for `work` too
    void note_coalesced(const c10::intrusive_ptr<c10d::Work> &work) {
        if (!coalescing_.load()) return;
        std::lock_guard<std::mutex> g(coalesce_mu_);
        if (coalescing_.load()) coalesced_.push_back(work);
    }
    // an op that threw (`what`, refused) inside a coalescing region ends it
    void end_refused_region(const char *what) {
        if (!coalescing_.load()) return;
        std::lock_guard<std::mutex> g(coalesce_mu_);
        if (!coalescing_.load()) return;
        coalescing_ = false;
        coalesced_.clear();
        refused_ = what;
    }
    // On the stack of each op: when the op leaves by an exception (collie
    // refused it), a coalescing region it was in ends (see startCoalescing).
    class RefusalGuard {
      public:
        RefusalGuard(ProcessGroupCollie &pg, const char *what)
            : pg_(pg), what_(what), throwing_(std::uncaught_exceptions()) {}
        ~RefusalGuard() {
            if (std::uncaught_exceptions() > throwing_) pg_.end_refused_region(what_);
        }

      private:
        ProcessGroupCollie &pg_;
        const char *what_;
        int throwing_;
    };
    c10::intrusive_ptr<c10d::Work> post_cuda(OpType type, const char *what, const at::Tensor &on,
                                             Tensors outputs, std::vector<at::Tensor> keep,
                                             std::chrono::milliseconds t, const CudaFn &fn,
                                             std::function<void()> unpack = nullptr) {
        return post_cuda(type, what, on.device(), std::move(outputs), std::move(keep), t, fn,
                         std::move(unpack));
    }
    // collie.torch's factory of the CUDA side (Python: makes the comm)
    void set_cuda_factory(py::object f) { cuda_.set_factory(std::move(f)); }
    // the CUDA side's comm, 0 until a CUDA op started it
    uintptr_t cuda_comm_handle() { return cuda_.handle(); }
    // starts the CUDA side on cuda:`device` as the first CUDA op would
    void start_cuda(int device) {
        std::shared_lock<std::shared_mutex> live(comm_mu_);
        TORCH_CHECK(comm_ != nullptr, "collie: CUDA side: ", closed_);
        cuda_.comm_for(c10::Device(c10::DeviceType::CUDA, (c10::DeviceIndex)device), "CUDA side");
    }

    c10::intrusive_ptr<c10d::Work> broadcast(Tensors &ts,
                                             const c10d::BroadcastOptions &opts) override {
        RefusalGuard refusal(*this, "broadcast");
        auto &t = single(ts, "broadcast");
        TORCH_CHECK(opts.rootTensor == 0, "collie: broadcast: rootTensor must be 0");
        auto dt = to_dtype(t, "broadcast", false);
        if (on_cuda(t))
            return post_cuda(OpType::BROADCAST, "broadcast", t, ts, {}, opts.timeout,
                             [&](auto c, auto s, auto o, auto w) {
                                 return collie_cuda_broadcast(c, t.data_ptr(), t.numel(), dt,
                                                              (int)opts.rootRank, s, o, w);
                             });
        return post(OpType::BROADCAST, "broadcast", ts, {}, opts.timeout, [&](auto o, auto w) {
            return collie_broadcast(comm_, t.data_ptr(), t.numel(), dt, (int)opts.rootRank, o, w);
        });
    }

    c10::intrusive_ptr<c10d::Work> allreduce(Tensors &ts,
                                             const c10d::AllreduceOptions &opts) override {
        RefusalGuard refusal(*this, "allreduce");
        auto &t = single(ts, "allreduce");
        auto dt = to_dtype(t, "allreduce", t.scalar_type() != at::kBool);
        auto op = to_redop(opts.reduceOp, t, "allreduce");
        if (on_cuda(t))
            return post_cuda(OpType::ALLREDUCE, "allreduce", t, ts, {}, opts.timeout,
                             [&](auto c, auto s, auto o, auto w) {
                                 return collie_cuda_allreduce(c, t.data_ptr(), t.data_ptr(),
                                                              t.numel(), dt, op, s, o, w);
                             });
        return post(OpType::ALLREDUCE, "allreduce", ts, {}, opts.timeout, [&](auto o, auto w) {
            return collie_allreduce(comm_, t.data_ptr(), t.data_ptr(), t.numel(), dt, op, o, w);
        });
    }

    c10::intrusive_ptr<c10d::Work>
    allreduce_coalesced(Tensors &ts, const c10d::AllreduceCoalescedOptions &opts) override {
        RefusalGuard refusal(*this, "allreduce_coalesced");
        TORCH_CHECK(!ts.empty(), "collie: allreduce_coalesced: no tensors");
        for (auto &t : ts) {
            check_tensor(t, "allreduce_coalesced");
            same_kind(ts[0], t, "allreduce_coalesced");
        }
        auto dt = to_dtype(ts[0], "allreduce_coalesced", ts[0].scalar_type() != at::kBool);
        auto op = to_redop(opts.reduceOp, ts[0], "allreduce_coalesced");
        auto flat = scratch_.flatten(ts);
        Tensors outs = ts;
        if (on_cuda(flat))
            return post_cuda(
                OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", flat, ts, {flat}, opts.timeout,
                [&](auto c, auto s, auto o, auto w) {
                    return collie_cuda_allreduce(c, flat.data_ptr(), flat.data_ptr(), flat.numel(),
                                                 dt, op, s, o, w);
                },
                unpack(flat, outs));
        return post(
            OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", ts, {flat}, opts.timeout,
            [&](auto o, auto w) {
                return collie_allreduce(comm_, flat.data_ptr(), flat.data_ptr(), flat.numel(), dt,
                                        op, o, w);
            },
            unpack(flat, outs));
    }

    c10::intrusive_ptr<c10d::Work> reduce(Tensors &ts, const c10d::ReduceOptions &opts) override {
        RefusalGuard refusal(*this, "reduce");
        auto &t = single(ts, "reduce");
        TORCH_CHECK(opts.rootTensor == 0, "collie: reduce: rootTensor must be 0");
        auto dt = to_dtype(t, "reduce", t.scalar_type() != at::kBool);
        auto op = to_redop(opts.reduceOp, t, "reduce");
        if (on_cuda(t))
            return post_cuda(OpType::REDUCE, "reduce", t, ts, {}, opts.timeout,
                             [&](auto c, auto s, auto o, auto w) {
                                 return collie_cuda_reduce(c, t.data_ptr(), t.data_ptr(), t.numel(),
                                                           dt, op, (int)opts.rootRank, s, o, w);
                             });
        return post(OpType::REDUCE, "reduce", ts, {}, opts.timeout, [&](auto o, auto w) {
            return collie_reduce(comm_, t.data_ptr(), t.data_ptr(), t.numel(), dt, op,
                                 (int)opts.rootRank, o, w);
        });
    }

    void check_list(const Tensors &list, const at::Tensor &like, const char *op) {
        TORCH_CHECK((int)list.size() == size_, "collie: ", op, ": the tensor list has ",
                    list.size(), " entries, the group ", size_, " ranks");
        for (auto &t : list) {
            check_tensor(t, op);
            same_kind(like, t, op);
            TORCH_CHECK(t.numel() == like.numel(), "collie: ", op,
                        ": every tensor of the list must hold ", like.numel(),
                        " elements (one has ", t.numel(), ")");
        }
    }

    c10::intrusive_ptr<c10d::Work> allgather(std::vector<Tensors> &outs, Tensors &ins,
                                             const c10d::AllgatherOptions &opts) override {
        RefusalGuard refusal(*this, "allgather");
        auto &in = single(ins, "allgather");
        TORCH_CHECK(outs.size() == 1, "collie: allgather takes one output list per process");
        check_list(outs[0], in, "allgather");
        auto dt = to_dtype(in, "allgather", false);
        auto flat = scratch_.empty((int64_t)size_ * in.numel(), in.options());
        if (on_cuda(in))
            return post_cuda(
                OpType::ALLGATHER, "allgather", in, outs[0], {in, flat}, opts.timeout,
                [&](auto c, auto s, auto o, auto w) {
                    return collie_cuda_allgather(c, in.data_ptr(), flat.data_ptr(), in.numel(), dt,
                                                 s, o, w);
                },
                unpack(flat, outs[0]));
        return post(
            OpType::ALLGATHER, "allgather", outs[0], {in, flat}, opts.timeout,
            [&](auto o, auto w) {
                return collie_allgather(comm_, in.data_ptr(), flat.data_ptr(), in.numel(), dt, o,
                                        w);
            },
            unpack(flat, outs[0]), ins);
    }

    c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &out, at::Tensor &in,
                                                   const c10d::AllgatherOptions &opts) override {
        RefusalGuard refusal(*this, "_allgather_base");
        check_tensor(in, "_allgather_base");
        check_tensor(out, "_allgather_base");
        same_kind(in, out, "_allgather_base");
        TORCH_CHECK(out.numel() == size_ * in.numel(), "collie: _allgather_base: the output holds ",
                    out.numel(), " elements, expected ", size_ * in.numel());
        auto dt = to_dtype(in, "_allgather_base", false);
        if (on_cuda(in))
            return post_cuda(OpType::_ALLGATHER_BASE, "_allgather_base", in, {out}, {in},
                             opts.timeout, [&](auto c, auto s, auto o, auto w) {
                                 return collie_cuda_allgather(c, in.data_ptr(), out.data_ptr(),
                                                              in.numel(), dt, s, o, w);
                             });
        return post(OpType::_ALLGATHER_BASE, "_allgather_base", {out}, {in}, opts.timeout,
                    [&](auto o, auto w) {
                        return collie_allgather(comm_, in.data_ptr(), out.data_ptr(), in.numel(),
                                                dt, o, w);
                    });
    }

    c10::intrusive_ptr<c10d::Work>
    allgather_coalesced(std::vector<Tensors> &outs, Tensors &ins,
                        const c10d::AllgatherOptions &opts) override {
        RefusalGuard refusal(*this, "allgather_coalesced");
        TORCH_CHECK(!ins.empty(), "collie: allgather_coalesced: no tensors");
        TORCH_CHECK((int)outs.size() == size_, "collie: allgather_coalesced: ", outs.size(),
                    " output lists for a group of ", size_);
        for (auto &t : ins) {
            check_tensor(t, "allgather_coalesced");
            same_kind(ins[0], t, "allgather_coalesced");
        }
        Tensors flat_outs;
        for (auto &list : outs) {
            TORCH_CHECK(list.size() == ins.size(),
                        "collie: allgather_coalesced: an output list "
                        "has ",
                        list.size(), " tensors, the input ", ins.size());
            for (size_t i = 0; i < list.size(); i++) {
                check_tensor(list[i], "allgather_coalesced");
                same_kind(ins[0], list[i], "allgather_coalesced");
                TORCH_CHECK(list[i].numel() == ins[i].numel(),
                            "collie: allgather_coalesced: output and input sizes differ");
                flat_outs.push_back(list[i]);
            }
        }
        auto dt = to_dtype(ins[0], "allgather_coalesced", false);
        auto in = scratch_.flatten(ins);
        auto flat = scratch_.empty((int64_t)size_ * in.numel(), in.options());
        if (on_cuda(in))
            return post_cuda(
                OpType::ALLGATHER_COALESCED, "allgather_coalesced", in, flat_outs, {in, flat},
                opts.timeout,
                [&](auto c, auto s, auto o, auto w) {
                    return collie_cuda_allgather(c, in.data_ptr(), flat.data_ptr(), in.numel(), dt,
                                                 s, o, w);
                },
                unpack(flat, flat_outs));
        return post(
            OpType::ALLGATHER_COALESCED, "allgather_coalesced", flat_outs, {in, flat}, opts.timeout,
            [&](auto o, auto w) {
                return collie_allgather(comm_, in.data_ptr(), flat.data_ptr(), in.numel(), dt, o,
                                        w);
            },
            unpack(flat, flat_outs), ins);
    }

#if COLLIE_TORCH2
    // Checks the pairs of a *_coalesced call: same count, one dtype, output i
    // holding `out_per_in` times input i's elements.
    void check_pairs(const Tensors &outs, const Tensors &ins, int64_t out_per_in, bool outer,
                     const char *op) {
        TORCH_CHECK(!ins.empty() && outs.size() == ins.size(), "collie: ", op, ": ", ins.size(),
                    " inputs and ", outs.size(), " outputs (one output per input, at least one)");
        for (size_t i = 0; i < ins.size(); i++) {
            check_tensor(ins[i], op);
            check_tensor(outs[i], op);
            same_kind(ins[0], ins[i], op);
            same_kind(ins[0], outs[i], op);
            int64_t big = outer ? outs[i].numel() : ins[i].numel();
            int64_t small = outer ? ins[i].numel() : outs[i].numel();
            TORCH_CHECK(big == out_per_in * small, "collie: ", op, ": pair ", i, " holds ", small,
                        " and ", big, " elements, expected a factor of the group size ", size_);
        }
    }

    // torch 2.x's _coalescing_manager for all_gather_into_tensor: one
    // collie allgather of the inputs packed one after the other; rank r's
    // part of output i is unpacked from rank r's block.
    c10::intrusive_ptr<c10d::Work>
    allgather_into_tensor_coalesced(Tensors &outs, Tensors &ins,
                                    const c10d::AllgatherOptions &opts) override {
        RefusalGuard refusal(*this, "allgather_into_tensor_coalesced");
        const char *op = "allgather_into_tensor_coalesced";
        check_pairs(outs, ins, size_, true, op);
        auto dt = to_dtype(ins[0], op, false);
        auto in = scratch_.flatten(ins);
        int64_t n = in.numel();
        auto flat = scratch_.empty((int64_t)size_ * n, in.options());
        int size = size_;
        Tensors list = outs;
        std::function<void()> out_fn = [flat, list, n, size]() mutable {
            int64_t off = 0;
            for (auto &t : list) {
                auto dst = t.view({size, -1});
                int64_t k = t.numel() / size;
                for (int r = 0; r < size; r++)
                    dst[r].copy_(flat.narrow(0, r * n + off, k));
                off += k;
            }
        };
        if (on_cuda(in))
            return post_cuda(
                OpType::COALESCED, op, in, outs, {in, flat}, opts.timeout,
                [&](auto c, auto s, auto o, auto w) {
                    return collie_cuda_allgather(c, in.data_ptr(), flat.data_ptr(), n, dt, s, o, w);
                },
                out_fn);
        return post(
            OpType::COALESCED, op, outs, {in, flat}, opts.timeout,
            [&](auto o, auto w) {
                return collie_allgather(comm_, in.data_ptr(), flat.data_ptr(), n, dt, o, w);
            },
            out_fn);
    }

    // torch 2.x's _coalescing_manager for reduce_scatter_tensor: one collie
    // reduce_scatter of a buffer whose block r holds every input's part r.
    c10::intrusive_ptr<c10d::Work>
    reduce_scatter_tensor_coalesced(Tensors &outs, Tensors &ins,
                                    const c10d::ReduceScatterOptions &opts) override {
        RefusalGuard refusal(*this, "reduce_scatter_tensor_coalesced");
        const char *op = "reduce_scatter_tensor_coalesced";
        check_pairs(outs, ins, size_, false, op);
        auto dt = to_dtype(outs[0], op, outs[0].scalar_type() != at::kBool);
        auto rop = to_redop(opts.reduceOp, outs[0], op);
        Tensors blocks;
        for (int r = 0; r < size_; r++)
            for (auto &t : ins)
                blocks.push_back(t.reshape({size_, -1})[r]);
        auto flat = at::cat(blocks);
        auto res = at::empty({flat.numel() / size_}, flat.options());
        if (on_cuda(flat))
            return post_cuda(
                OpType::COALESCED, op, flat, outs, {flat, res}, opts.timeout,
                [&](auto c, auto s, auto o, auto w) {
                    return collie_cuda_reduce_scatter(c, flat.data_ptr(), res.data_ptr(),
                                                      res.numel(), dt, rop, s, o, w);
                },
                unpack(res, outs));
        return post(
            OpType::COALESCED, op, outs, {flat, res}, opts.timeout,
            [&](auto o, auto w) {
                return collie_reduce_scatter(comm_, flat.data_ptr(), res.data_ptr(), res.numel(),
                                             dt, rop, o, w);
            },
            unpack(res, outs));
    }
#endif

    c10::intrusive_ptr<c10d::Work> gather(std::vector<Tensors> &outs, Tensors &ins,
                                          const c10d::GatherOptions &opts) override {
        RefusalGuard refusal(*this, "gather");
        auto &in = single(ins, "gather");
        auto dt = to_dtype(in, "gather", false);
        int root = (int)opts.rootRank;
        at::Tensor flat;
        Tensors list;
        if (rank_ == root) {
            TORCH_CHECK(outs.size() == 1, "collie: gather: the root takes one output list");
            check_list(outs[0], in, "gather");
            list = outs[0];
            flat = scratch_.empty((int64_t)size_ * in.numel(), in.options());
        } else {
            TORCH_CHECK(outs.empty(), "collie: gather: only the root passes output tensors");
        }
        if (on_cuda(in))
            return post_cuda(
                OpType::GATHER, "gather", in, list, {in, flat}, opts.timeout,
                [&](auto c, auto s, auto o, auto w) {
                    return collie_cuda_gather(c, in.data_ptr(),
                                              flat.defined() ? flat.data_ptr() : nullptr,
                                              in.numel(), dt, root, s, o, w);
                },
                flat.defined() ? unpack(flat, list) : nullptr);
        return post(
            OpType::GATHER, "gather", list, {in, flat}, opts.timeout,
            [&](auto o, auto w) {
                return collie_gather(comm_, in.data_ptr(),
                                     flat.defined() ? flat.data_ptr() : nullptr, in.numel(), dt,
                                     root, o, w);
            },
            flat.defined() ? unpack(flat, list) : nullptr);
    }

    c10::intrusive_ptr<c10d::Work> scatter(Tensors &outs, std::vector<Tensors> &ins,
                                           const c10d::ScatterOptions &opts) override {
        RefusalGuard refusal(*this, "scatter");
        auto &out = single(outs, "scatter");
        auto dt = to_dtype(out, "scatter", false);
        int root = (int)opts.rootRank;
        at::Tensor flat;
        if (rank_ == root) {
            TORCH_CHECK(ins.size() == 1, "collie: scatter: the root takes one input list");
            check_list(ins[0], out, "scatter");
            flat = scratch_.flatten(ins[0]);
        } else {
            TORCH_CHECK(ins.empty(), "collie: scatter: only the root passes input tensors");
        }
        if (on_cuda(out))
            return post_cuda(OpType::SCATTER, "scatter", out, outs, {flat}, opts.timeout,
                             [&](auto c, auto s, auto o, auto w) {
                                 return collie_cuda_scatter(
                                     c, flat.defined() ? flat.data_ptr() : nullptr, out.data_ptr(),
                                     out.numel(), dt, root, s, o, w);
                             });
        return post(OpType::SCATTER, "scatter", outs, {flat}, opts.timeout, [&](auto o, auto w) {
            return collie_scatter(comm_, flat.defined() ? flat.data_ptr() : nullptr, out.data_ptr(),
                                  out.numel(), dt, root, o, w);
        });
    }

    c10::intrusive_ptr<c10d::Work> reduce_scatter(Tensors &outs, std::vector<Tensors> &ins,
                                                  const c10d::ReduceScatterOptions &opts) override {
        RefusalGuard refusal(*this, "reduce_scatter");
        auto &out = single(outs, "reduce_scatter");
        TORCH_CHECK(ins.size() == 1, "collie: reduce_scatter takes one input list per process");
        check_list(ins[0], out, "reduce_scatter");
        auto dt = to_dtype(out, "reduce_scatter", out.scalar_type() != at::kBool);
        auto op = to_redop(opts.reduceOp, out, "reduce_scatter");
        auto flat = scratch_.flatten(ins[0]);
        if (on_cuda(out))
            return post_cuda(OpType::REDUCE_SCATTER, "reduce_scatter", out, outs, {flat},
                             opts.timeout, [&](auto c, auto s, auto o, auto w) {
                                 return collie_cuda_reduce_scatter(c, flat.data_ptr(),
                                                                   out.data_ptr(), out.numel(), dt,
                                                                   op, s, o, w);
                             });
        return post(OpType::REDUCE_SCATTER, "reduce_scatter", outs, {flat}, opts.timeout,
                    [&](auto o, auto w) {
                        return collie_reduce_scatter(comm_, flat.data_ptr(), out.data_ptr(),
                                                     out.numel(), dt, op, o, w);
                    });
    }

    c10::intrusive_ptr<c10d::Work>
    _reduce_scatter_base(at::Tensor &out, at::Tensor &in,
                         const c10d::ReduceScatterOptions &opts) override {
        RefusalGuard refusal(*this, "_reduce_scatter_base");
        check_tensor(in, "_reduce_scatter_base");
        check_tensor(out, "_reduce_scatter_base");
        same_kind(in, out, "_reduce_scatter_base");
        TORCH_CHECK(in.numel() == size_ * out.numel(),
                    "collie: _reduce_scatter_base: the input "
                    "holds ",
                    in.numel(), " elements, expected ", size_ * out.numel());
        auto dt = to_dtype(out, "_reduce_scatter_base", out.scalar_type() != at::kBool);
        auto op = to_redop(opts.reduceOp, out, "_reduce_scatter_base");
        if (on_cuda(out))
            return post_cuda(OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base", out, {out}, {in},
                             opts.timeout, [&](auto c, auto s, auto o, auto w) {
                                 return collie_cuda_reduce_scatter(c, in.data_ptr(), out.data_ptr(),
                                                                   out.numel(), dt, op, s, o, w);
                             });
        return post(OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base", {out}, {in}, opts.timeout,
                    [&](auto o, auto w) {
                        return collie_reduce_scatter(comm_, in.data_ptr(), out.data_ptr(),
                                                     out.numel(), dt, op, o, w);
                    });
    }

    // Per-peer element counts of a tensor split along dim 0 (torch's split sizes).
    std::vector<size_t> split_counts(const at::Tensor &t, const std::vector<int64_t> &split,
                                     const char *what) {
        std::vector<size_t> counts(size_);
        int64_t rows = t.dim() == 0 ? 1 : t.size(0);
        int64_t row = rows ? t.numel() / rows : 0;
        if (split.empty()) {
            TORCH_CHECK(rows % size_ == 0, "collie: alltoall_base: dim 0 of the ", what, " (", rows,
                        ") does not split evenly over ", size_, " ranks");
            for (auto &c : counts)
                c = (size_t)(rows / size_ * row);
            return counts;
        }
        TORCH_CHECK((int)split.size() == size_, "collie: alltoall_base: ", split.size(), " ", what,
                    " split sizes for a group of ", size_);
        int64_t sum = 0;
        for (int i = 0; i < size_; i++) {
            TORCH_CHECK(split[i] >= 0, "collie: alltoall_base: negative split size");
            counts[i] = (size_t)(split[i] * row);
            sum += split[i];
        }
        TORCH_CHECK(sum == rows, "collie: alltoall_base: the ", what, " split sizes add up to ",
                    sum, ", dim 0 is ", rows);
        return counts;
    }

    c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &out, at::Tensor &in,
                                                 std::vector<int64_t> &out_split,
                                                 std::vector<int64_t> &in_split,
                                                 const c10d::AllToAllOptions &opts) override {
        RefusalGuard refusal(*this, "alltoall_base");
        check_tensor(in, "alltoall_base");
        check_tensor(out, "alltoall_base");
        same_kind(in, out, "alltoall_base");
        auto dt = to_dtype(in, "alltoall_base", false);
        if (out_split.empty() && in_split.empty()) {
            TORCH_CHECK(in.numel() == out.numel() && in.numel() % size_ == 0,
                        "collie: alltoall_base: input and output must hold the same number of "
                        "elements, a multiple of the group size");
            if (on_cuda(in))
                return post_cuda(OpType::ALLTOALL_BASE, "alltoall_base", in, {out}, {in},
                                 opts.timeout, [&](auto c, auto s, auto o, auto w) {
                                     return collie_cuda_alltoall(c, in.data_ptr(), out.data_ptr(),
                                                                 in.numel() / size_, dt, s, o, w);
                                 });
            return post(OpType::ALLTOALL_BASE, "alltoall_base", {out}, {in}, opts.timeout,
                        [&](auto o, auto w) {
                            return collie_alltoall(comm_, in.data_ptr(), out.data_ptr(),
                                                   in.numel() / size_, dt, o, w);
                        });
        }
        auto sc = split_counts(in, in_split, "input");
        auto rc = split_counts(out, out_split, "output");
        if (on_cuda(in))
            return post_cuda(OpType::ALLTOALL_BASE, "alltoall_base", in, {out}, {in}, opts.timeout,
                             [&](auto c, auto s, auto o, auto w) {
                                 return collie_cuda_alltoallv(c, in.data_ptr(), sc.data(), nullptr,
                                                              out.data_ptr(), rc.data(), nullptr,
                                                              dt, s, o, w);
                             });
        return post(OpType::ALLTOALL_BASE, "alltoall_base", {out}, {in}, opts.timeout,
                    [&](auto o, auto w) {
                        return collie_alltoallv(comm_, in.data_ptr(), sc.data(), nullptr,
                                                out.data_ptr(), rc.data(), nullptr, dt, o, w);
                    });
    }

    c10::intrusive_ptr<c10d::Work> alltoall(Tensors &outs, Tensors &ins,
                                            const c10d::AllToAllOptions &opts) override {
        RefusalGuard refusal(*this, "alltoall");
        TORCH_CHECK((int)outs.size() == size_ && (int)ins.size() == size_,
                    "collie: alltoall: ", "one input and one output tensor per rank (", ins.size(),
                    " and ", outs.size(), " for a group of ", size_, ")");
        std::vector<size_t> sc(size_), rc(size_);
        for (int i = 0; i < size_; i++) {
            check_tensor(ins[i], "alltoall");
            check_tensor(outs[i], "alltoall");
            same_kind(ins[0], ins[i], "alltoall");
            same_kind(ins[0], outs[i], "alltoall");
            sc[i] = ins[i].numel();
            rc[i] = outs[i].numel();
        }
        auto dt = to_dtype(ins[0], "alltoall", false);
        auto in = scratch_.flatten(ins);
        auto flat = scratch_.flatten(outs);
        if (on_cuda(in))
            return post_cuda(
                OpType::ALLTOALL, "alltoall", in, outs, {in, flat}, opts.timeout,
                [&](auto c, auto s, auto o, auto w) {
                    return collie_cuda_alltoallv(c, in.data_ptr(), sc.data(), nullptr,
                                                 flat.data_ptr(), rc.data(), nullptr, dt, s, o, w);
                },
                unpack(flat, outs));
        return post(
            OpType::ALLTOALL, "alltoall", outs, {in, flat}, opts.timeout,
            [&](auto o, auto w) {
                return collie_alltoallv(comm_, in.data_ptr(), sc.data(), nullptr, flat.data_ptr(),
                                        rc.data(), nullptr, dt, o, w);
            },
            unpack(flat, outs));
    }

    c10::intrusive_ptr<c10d::Work> send(Tensors &ts, int dst, int tag) override {
        RefusalGuard refusal(*this, "send");
        auto &t = single(ts, "send");
        auto dt = to_dtype(t, "send", false);
        TORCH_CHECK(tag >= 0, "collie: send: tag ", tag, " must be >= 0");
        if (on_cuda(t))
            return post_cuda(OpType::SEND, "send", t, {}, {t}, c10d::kUnsetTimeout,
                             [&](auto c, auto s, auto o, auto w) {
                                 return collie_cuda_send(c, t.data_ptr(), t.numel(), dt, dst,
                                                         (uint64_t)tag, s, o, w);
                             });
        return post(OpType::SEND, "send", {}, {t}, c10d::kUnsetTimeout, [&](auto o, auto w) {
            return collie_send(comm_, t.data_ptr(), t.numel(), dt, dst, (uint64_t)tag, o, w);
        });
    }

    c10::intrusive_ptr<c10d::Work> recv(Tensors &ts, int src, int tag) override {
        RefusalGuard refusal(*this, "recv");
        auto &t = single(ts, "recv");
        auto dt = to_dtype(t, "recv", false);
        TORCH_CHECK(tag >= 0, "collie: recv: tag ", tag, " must be >= 0");
        if (on_cuda(t))
            return post_cuda(OpType::RECV, "recv", t, ts, {}, c10d::kUnsetTimeout,
                             [&](auto c, auto s, auto o, auto w) {
                                 return collie_cuda_recv(c, t.data_ptr(), t.numel(), dt, src,
                                                         (uint64_t)tag, s, o, w);
                             });
        return post(OpType::RECV, "recv", ts, {}, c10d::kUnsetTimeout, [&](auto o, auto w) {
            return collie_recv(comm_, t.data_ptr(), t.numel(), dt, src, (uint64_t)tag, o, w);
        });
    }

    c10::intrusive_ptr<c10d::Work> recvAnysource(Tensors &ts, int tag) override {
        RefusalGuard refusal(*this, "recvAnysource");
        auto &t = single(ts, "recv");
        auto dt = to_dtype(t, "recv", false);
        TORCH_CHECK(tag >= 0, "collie: recv: tag ", tag, " must be >= 0");
        if (on_cuda(t)) unsupported("recv from any source of CUDA tensors (NCCL has none)");
        return post(OpType::RECVANYSOURCE, "recv", ts, {}, c10d::kUnsetTimeout,
                    [&](auto o, auto w) {
                        return collie_recv(comm_, t.data_ptr(), t.numel(), dt, COLLIE_ANY_SOURCE,
                                           (uint64_t)tag, o, w);
                    });
    }

    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &opts) override {
        RefusalGuard refusal(*this, "barrier");
        // on a CUDA device (torch's barrier(device_ids=[...]), or the device
        // torch 2.x picks): through the CUDA side, after the collectives
        // posted there; wait() blocks the host (cuda_side.h); else the CPU comm
        if (auto dev = barrier_device(opts)) {
            c10::Device on = *dev;
            return post_cuda(
                OpType::BARRIER, "barrier", on, {}, {}, opts.timeout,
                [&](auto c, auto s, auto o, auto w) { return collie_cuda_barrier(c, s, o, w); });
        }
        return post(OpType::BARRIER, "barrier", {}, {}, opts.timeout,
                    [&](auto o, auto w) { return collie_barrier(comm_, o, w); });
    }

    // c10d's straggler report, gloo's monitoredBarrier and its messages
    // (torch's test_monitored_barrier_* match them): every rank but 0 sends
    // rank 0 a token and waits for its reply; rank 0 waits up to the timeout
    // for each token (all its receives run at once, so wait_all_ranks costs
    // one timeout, not one per rank) and names the first rank, or with
    // wait_all_ranks every rank, whose token did not come. Unlike gloo, rank
    // 0 replies also on failure, with its report: the ranks that came raise
    // at once naming rank 0 and what it saw, not at their own deadline.
    // Point-to-point works on tags no torch tag reaches (>= 2^62), two per
    // call; a receive that timed out unmatched leaves the comm healthy.
    void monitoredBarrier(const c10d::BarrierOptions &opts, bool wait_all) override {
        uint64_t tag = kMonitoredTag + 2 * monitored_++;
        if (rank_ != 0) {
            monitored_peer(tag);
            return;
        }
        std::string report = monitored_root(tag, opts.timeout, wait_all);
        TORCH_CHECK(report.empty(), report);
    }

    // collie's own abort(reason) (Python); a no-op once the comm is gone
    void abort(const std::string &reason) {
        std::shared_lock<std::shared_mutex> g(comm_mu_);
        if (comm_) collie_comm_abort(comm_, reason.c_str());
        cuda_.abort(reason.c_str());
    }

  private:
    static constexpr uint64_t kMonitoredTag = 1ull << 62; // above every torch tag
    static constexpr size_t kNote = 512;                  // rank 0's reply (its report)

    // monitoredBarrier on a rank other than 0: its token to rank 0, then
    // rank 0's reply; both under the comm's own timeout (gloo's: only rank
    // 0 applies the barrier's). comm_mu_ is held for the posts only: a
    // shutdown or abort meanwhile fails the waits at once (EABORTED).
    void monitored_peer(uint64_t tag) {
        int32_t token = rank_;
        std::array<char, kNote> note{};
        collie_work *send = nullptr, *recv = nullptr;
        std::string err;
        int st;
        {
            std::shared_lock<std::shared_mutex> g(comm_mu_);
            TORCH_CHECK(comm_, "collie: monitoredBarrier: ", closed_);
            st = collie_send(comm_, &token, 1, COLLIE_INT32, 0, tag, nullptr, &send);
            if (st != COLLIE_OK) err = collie_error(st, "send");
            st = collie_recv(comm_, note.data(), kNote, COLLIE_UINT8, 0, tag + 1, nullptr, &recv);
            if (st != COLLIE_OK && err.empty()) err = collie_error(st, "recv");
        }
        if (send) {
            st = collie_work_wait(send, COLLIE_TIMEOUT_INFINITE); // bounded by its deadline
            if (st != COLLIE_OK && err.empty()) err = work_error(send, st);
            if (st != COLLIE_OK && recv) collie_work_cancel(recv); // no reply will come
        }
        if (recv) {
            st = collie_work_wait(recv, COLLIE_TIMEOUT_INFINITE);
            if (st != COLLIE_OK && err.empty()) err = work_error(recv, st);
        }
        collie_work_release(send);
        collie_work_release(recv);
        note[kNote - 1] = 0;
        if (err.empty() && note[0]) err = std::string("rank 0 reports: ") + note.data();
        TORCH_CHECK(err.empty(), "Rank ", rank_,
                    " successfully reached monitoredBarrier, but received errors while waiting "
                    "for send/recv from rank 0. Please check rank 0 logs for faulty rank.\n "
                    "Original exception: \n",
                    err);
    }

    // monitoredBarrier on rank 0: every other rank's token (each receive
    // under the barrier's timeout, all at once), then the reply to each;
    // returns the report ("" when every rank came). comm_mu_ is held for
    // the posts only, as in monitored_peer. A dead peer fails the whole
    // comm, and with it the receives of live ranks whose token had not come
    // yet: when the comm's fault names its cause (rank N), the report names
    // that rank (as gloo, whose receive from it fails), and no rank whose
    // receive failed only because of the comm's fault; a token that came
    // before the fault counted.
    std::string monitored_root(uint64_t tag, std::chrono::milliseconds timeout, bool wait_all) {
        bool zero = timeout != c10d::kUnsetTimeout && timeout.count() <= 0;
        std::vector<int32_t> tokens(size_);
        std::vector<collie_work *> recvs(size_, nullptr);
        std::vector<int> failed, status(size_, COLLIE_OK);
        std::vector<std::string> errors(size_);
        int32_t shown_ms = (int32_t)std::max<int64_t>(0, timeout.count()); // for the messages
        std::shared_lock<std::shared_mutex> g(comm_mu_);
        TORCH_CHECK(comm_, "collie: monitoredBarrier: ", closed_);
        for (int r = 1; r < size_ && (wait_all || !zero); r++) {
            collie_post_opts o = COLLIE_POST_OPTS_INIT;
            o.timeout_ms = timeout_ms(timeout);
            int st = collie_recv(comm_, &tokens[r], 1, COLLIE_INT32, r, tag, &o, &recvs[r]);
            collie_work_details d{};
            if (st == COLLIE_OK && timeout == c10d::kUnsetTimeout &&
                collie_work_info(recvs[r], &d) == COLLIE_OK)
                shown_ms = d.timeout_ms; // the comm's own
            if (st != COLLIE_OK) {
                status[r] = st;
                errors[r] = collie_error(st, "recv");
            }
        }
        g.unlock();
        for (int r = 1; r < size_; r++) {
            if (!recvs[r]) continue;
            int st = collie_work_wait(recvs[r], COLLIE_TIMEOUT_INFINITE); // bounded by its deadline
            if (st != COLLIE_OK) {
                status[r] = st;
                errors[r] = work_error(recvs[r], st);
            }
            collie_work_release(recvs[r]);
        }
        // what collie knows of the comm's health (a dead peer, an abort)
        g.lock();
        int cst = COLLIE_OK;
        const char *cmsg = nullptr;
        std::string comm_fault;
        if (comm_ && collie_comm_error(comm_, &cst, &cmsg) != COLLIE_OK) // returns its status
            comm_fault = std::string(cmsg ? cmsg : "") + " (" + collie_status_name(cst) + ")";
        g.unlock();
        int cause = comm_fault.empty() ? -1 : fault_rank(comm_fault.c_str());
        for (int r = 1; r < size_; r++)
            if (status[r] != COLLIE_OK &&
                (cause < 1 || cause >= size_ || r == cause || status[r] == COLLIE_ETIMEDOUT))
                failed.push_back(r);
        std::string first_error = failed.empty() ? "" : errors[failed[0]];
        std::string in = " failed to pass monitoredBarrier in " + std::to_string(shown_ms) + " ms";
        std::string report;
        if (size_ > 1 && !wait_all && zero) {
            report = "Rank 0 timed out in monitoredBarrier after " + std::to_string(shown_ms) +
                     " ms.\nNo ranks successfully processed in monitoredBarrier.";
        } else if (!failed.empty() && !wait_all) {
            report = "[Rank 0]: Rank " + std::to_string(failed[0]) + in +
                     "\n Original exception: \n" + first_error;
        } else if (!failed.empty()) {
            std::string list;
            for (int r : failed)
                list += (list.empty() ? "" : ", ") + std::to_string(r);
            report = "[Rank 0]: Ranks " + list + in + "\n First exception: \n" + first_error;
        }
        if (!report.empty() && !comm_fault.empty())
            report += "\n The comm has failed: " + comm_fault;
        std::string reply_error = monitored_reply(tag + 1, report);
        if (report.empty() && !reply_error.empty()) {
            // every token came, a reply failed: the comm's fault names whom
            std::string who = reply_error.substr(0, reply_error.find(':'));
            if (cause >= 1 && cause < size_) who = "Rank " + std::to_string(cause);
            report = "[Rank 0]: " + who + in + "\n Original exception: \n" +
                     reply_error.substr(reply_error.find(':') + 2);
        }
        return report;
    }

    // The rank a comm's fault names as its cause: the innermost "rank N" of
    // its root cause past the relays ("rank 1 failed: rank 2 closed its
    // connection": 2); -1 when it names none.
    static int fault_rank(const char *msg) {
        int who = -1;
        for (int i = 0; msg && i < 16; i++) {
            int r = -1, n = 0;
            if (sscanf(msg, "rank %d%n", &r, &n) != 1 || n == 0) break;
            who = r;
            if (strncmp(msg + n, " failed: ", 9) != 0) break;
            msg += n + 9;
        }
        return who;
    }

    // Rank 0's reply to every other rank: "" lets them through, else its
    // report (cut to kNote - 1 bytes). Returns "Rank R: <error>" for the
    // first reply that failed, else "".
    std::string monitored_reply(uint64_t tag, const std::string &report) {
        std::vector<std::array<char, kNote>> notes(size_);
        std::vector<collie_work *> sends(size_, nullptr);
        std::string err;
        std::shared_lock<std::shared_mutex> g(comm_mu_);
        for (int r = 1; r < size_; r++) {
            snprintf(notes[r].data(), kNote, "%s", report.c_str());
            if (!comm_) {
                err = "Rank " + std::to_string(r) + ": collie: send: " + closed_;
                break;
            }
            int st = collie_send(comm_, notes[r].data(), kNote, COLLIE_UINT8, r, tag, nullptr,
                                 &sends[r]);
            if (st != COLLIE_OK && err.empty())
                err = "Rank " + std::to_string(r) + ": " + collie_error(st, "send");
        }
        g.unlock();
        for (int r = 1; r < size_; r++) {
            if (!sends[r]) continue;
            int st = collie_work_wait(sends[r], COLLIE_TIMEOUT_INFINITE); // bounded by its deadline
            if (st != COLLIE_OK && err.empty())
                err = "Rank " + std::to_string(r) + ": " + work_error(sends[r], st);
            collie_work_release(sends[r]);
        }
        return err;
    }

    // Tears the comm down once (shutdown, abort, the destructor; idempotent):
    // aborts the works in flight (all of them with `always_abort`) naming
    // `reason`, destroys the comm (bounded: nothing is left pending), and
    // makes later posts fail naming `reason`. Exclusive against post().
    void teardown(const char *reason, bool always_abort) {
        tearing_ = true;
        if (always_abort || splitting_.load() > 0) { // a split in flight ends at once (split)
            std::shared_lock<std::shared_mutex> s(comm_mu_);
            if (comm_) collie_comm_abort(comm_, reason);
        }
        std::unique_lock<std::shared_mutex> g(comm_mu_);
        if (!comm_) return;
        collie_comm_stats st{};
        st.size = sizeof st;
        if (always_abort || (collie_comm_get_stats(comm_, &st) == COLLIE_OK && st.in_flight > 0))
            collie_comm_abort(comm_, reason);
        collie_comm_destroy(comm_);
        comm_ = nullptr;
        closed_ = reason;
        cuda_.teardown(reason, always_abort);
        g.unlock(); // shrink_mu_ is taken before comm_mu_ (shrink_agree)
        std::lock_guard<std::mutex> sg(shrink_mu_); // a shrink's comm nobody took
        if (shrunk_) collie_comm_destroy(shrunk_);
        shrunk_ = nullptr;
    }

    std::shared_mutex comm_mu_; // comm_'s lifetime: shared by posts, exclusive by teardown
    collie_comm *comm_;
    std::string closed_; // why comm_ is gone
    std::shared_ptr<Completer> completer_;
    std::atomic<uint64_t> seq_{0};
    CudaSide cuda_;                      // the CUDA tensors' comm (cuda_side.h)
    ScratchPool scratch_;                // flat buffers of the list-shaped ops (scratch.h)
    std::atomic<uint64_t> monitored_{0}; // monitoredBarrier calls (their tags)
    std::atomic<int> splitting_{0};      // splits in flight (split)
    std::atomic<bool> tearing_{false};   // teardown has begun
    std::mutex shrink_mu_;               // one shrink at a time; guards shrunk_
    collie_comm *shrunk_ = nullptr;      // the survivors' comm until shrink_to takes it
    // the comm's default op timeout in ms (-1: none; -2: not known yet)
    std::atomic<int64_t> default_timeout_ms_;
    // between startCoalescing and endCoalescing (torch 2.x): the works posted
    std::atomic<bool> coalescing_{false};
    std::mutex coalesce_mu_;
    std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;
    std::string refused_; // the op whose refusal ended the last region ("" if none)
};

} // namespace collie_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    using collie_torch::ProcessGroupCollie;
    auto pg_class =
        py::class_<ProcessGroupCollie, c10::intrusive_ptr<ProcessGroupCollie>,
                   collie_torch::BackendBase>(m, "ProcessGroupCollie")
            .def(py::init<int, int, uintptr_t, std::chrono::milliseconds>(), py::arg("rank"),
                 py::arg("size"), py::arg("comm"), py::arg("timeout") = c10d::kUnsetTimeout)
            .def("comm_handle", &ProcessGroupCollie::comm_handle)
            .def("_lost_ranks", &ProcessGroupCollie::lost_ranks)
            .def("rank_map", &ProcessGroupCollie::rank_map)
            .def("_set_cuda_factory", &ProcessGroupCollie::set_cuda_factory)
            .def("cuda_comm_handle", &ProcessGroupCollie::cuda_comm_handle)
            .def("_cuda_start", &ProcessGroupCollie::start_cuda, py::arg("device"),
                 py::call_guard<py::gil_scoped_release>())
            .def(
                "abort",
                [](ProcessGroupCollie &pg, const std::string &reason) { pg.abort(reason); },
                py::arg("reason"), py::call_guard<py::gil_scoped_release>());
#if COLLIE_TORCH2
    // torch's abort() (no reason) is the teardown; the binding above would hide it
    pg_class.def(
        "abort", [](ProcessGroupCollie &pg) { pg.abort(); },
        py::call_guard<py::gil_scoped_release>());
    // collie.torch.shrink's first step: the agreement (the ranks left out)
    pg_class.def(
        "_shrink_agree",
        [](ProcessGroupCollie &pg, std::chrono::milliseconds t, bool abort_first) {
            return pg.shrink_agree(t, abort_first ? 2 : 0);
        },
        py::arg("timeout") = c10d::kUnsetTimeout, py::arg("abort_first") = false,
        py::call_guard<py::gil_scoped_release>());
    pg_class.attr("_torch_has_shrink") = collie_torch::has_shrink<collie_torch::BackendBase>::value;
#else
    (void)pg_class;
#endif
    m.def("at_exit", &collie_torch::Completer::at_exit, py::call_guard<py::gil_scoped_release>());
}
