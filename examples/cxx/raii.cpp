// raii.cpp — collie from C++: the C headers as they are, wrapped in small
// RAII types a C++ server would write once (collie has no C++ API of its
// own; these wrappers are the example, copy and adapt them).
//
//   build/bin/collie-run -n 2 -- build/examples/cxx/raii
//
//  - collie::Error: a failed call or work as an exception carrying the
//    status and collie's message.
//  - collie::Work: owns one reference to a work; move-only; the destructor
//    releases it (releasing never cancels: the work goes on).
//  - collie::Engine, collie::Comm: destroyed in reverse order of creation,
//    as their C counterparts require (comms before their engine).
// The program runs allreduces with several works in flight, waits on them
// with a deadline, reads the comm's stats, and checks a send/recv pair.
#include <collie.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace collie {

class Error : public std::runtime_error {
  public:
    Error(int status, const std::string &what)
        : std::runtime_error(what + ": " + collie_status_name(status)), status_(status) {}
    int status() const { return status_; }

  private:
    int status_;
};

inline void check(int rc, const char *what) {
    if (rc != COLLIE_OK) throw Error(rc, std::string(what) + " (" + collie_last_error() + ")");
}

class Work {
  public:
    Work() = default;
    explicit Work(collie_work *w) : w_(w) {}
    Work(Work &&o) noexcept : w_(std::exchange(o.w_, nullptr)) {}
    Work &operator=(Work &&o) noexcept {
        if (this != &o) {
            collie_work_release(w_);
            w_ = std::exchange(o.w_, nullptr);
        }
        return *this;
    }
    Work(const Work &) = delete;
    Work &operator=(const Work &) = delete;
    ~Work() { collie_work_release(w_); }

    bool test() const { return collie_work_test(w_); }
    // Wait at most timeout_ms; throws on failure or if the wait gave up.
    void wait(int32_t timeout_ms) {
        int st = collie_work_wait(w_, timeout_ms);
        if (st == COLLIE_INPROGRESS) throw Error(st, "wait gave up");
        if (st != COLLIE_OK) throw Error(st, collie_work_error_message(w_));
    }

  private:
    collie_work *w_ = nullptr;
};

class Engine {
  public:
    Engine() { check(collie_engine_create(nullptr, &e_), "collie_engine_create"); }
    Engine(const Engine &) = delete;
    Engine &operator=(const Engine &) = delete;
    ~Engine() { collie_engine_destroy(e_); }
    collie_engine *get() const { return e_; }

  private:
    collie_engine *e_ = nullptr;
};

class Comm {
  public:
    explicit Comm(Engine &e) {
        collie_comm_opts o = COLLIE_COMM_OPTS_INIT;
        o.name = "cxx";
        check(collie_comm_create_from_env(e.get(), &o, &c_), "collie_comm_create_from_env");
    }
    Comm(const Comm &) = delete;
    Comm &operator=(const Comm &) = delete;
    ~Comm() { collie_comm_destroy(c_); }

    int rank() const { return collie_comm_rank(c_); }
    int size() const { return collie_comm_size(c_); }

    Work allreduce(std::vector<float> &buf, collie_redop op = COLLIE_SUM) {
        collie_work *w = nullptr;
        check(collie_allreduce(c_, buf.data(), buf.data(), buf.size(), COLLIE_FP32, op, nullptr,
                               &w),
              "collie_allreduce");
        return Work(w);
    }
    Work send(const std::vector<float> &buf, int peer, uint64_t tag) {
        collie_work *w = nullptr;
        check(collie_send(c_, buf.data(), buf.size(), COLLIE_FP32, peer, tag, nullptr, &w),
              "collie_send");
        return Work(w);
    }
    Work recv(std::vector<float> &buf, int peer, uint64_t tag) {
        collie_work *w = nullptr;
        check(collie_recv(c_, buf.data(), buf.size(), COLLIE_FP32, peer, tag, nullptr, &w),
              "collie_recv");
        return Work(w);
    }
    collie_comm_stats stats() const {
        collie_comm_stats st{}; // COLLIE_COMM_STATS_INIT is C's designated initialiser
        st.size = sizeof st;
        check(collie_comm_get_stats(c_, &st), "collie_comm_get_stats");
        return st;
    }

  private:
    collie_comm *c_ = nullptr;
};

} // namespace collie

int main() {
    try {
        collie::Engine engine;
        collie::Comm comm(engine);
        const int rank = comm.rank(), n = comm.size();
        constexpr int kInFlight = 4, kCount = 256;
        std::vector<std::vector<float>> bufs(kInFlight, std::vector<float>(kCount));
        std::vector<collie::Work> works;
        for (int k = 0; k < kInFlight; k++) {
            for (float &x : bufs[k]) x = float(rank + k);
            works.push_back(comm.allreduce(bufs[k]));
        }
        for (int k = 0; k < kInFlight; k++) {
            works[k].wait(30000);
            const float want = float(n * (n - 1) / 2 + n * k);
            for (float x : bufs[k])
                if (x != want) throw std::runtime_error("allreduce: wrong result");
        }
        std::printf("rank %d: %d allreduces in flight: results correct\n", rank, kInFlight);

        if (n >= 2 && rank < 2) { // ranks 0 and 1 swap a message
            std::vector<float> out(kCount, float(rank + 10)), in(kCount, -1.0f);
            collie::Work r = comm.recv(in, 1 - rank, 7);
            collie::Work s = comm.send(out, 1 - rank, 7);
            s.wait(30000);
            r.wait(30000);
            if (in[0] != float(1 - rank + 10)) throw std::runtime_error("recv: wrong data");
            std::printf("rank %d: send/recv with rank %d ok\n", rank, 1 - rank);
        }
        collie_comm_stats st = comm.stats();
        std::printf("rank %d: stats: %llu posted, %llu completed, %llu failed\n", rank,
                    (unsigned long long)st.posted, (unsigned long long)st.completed,
                    (unsigned long long)st.failed);
        if (st.completed != st.posted || st.failed != 0)
            throw std::runtime_error("stats do not add up");
    } catch (const collie::Error &e) {
        std::fprintf(stderr, "collie error %d: %s\n", e.status(), e.what());
        return 1;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    std::printf("raii ok\n");
    return 0;
}
