// The MPI communicator (Open MPI from Debian): MPI_COMM_WORLD of the processes mpirun started.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <numeric>
#include <thread>

#include "common/error.h"
#include "dist/comm.h"

namespace spool::dist {

namespace {

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail("%s failed: %.*s", call, len, msg);
}

// Element counts and displacements for the v-collectives (int, as MPI-3 takes them).
std::vector<int> as_ints(std::span<const int64_t> rows, int64_t width, const char* call) {
  std::vector<int> v(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t n = rows[i] * width;
    if (n < 0 || n > INT_MAX) fail("%s: %lld floats to one rank exceed MPI's int counts", call, static_cast<long long>(n));
    v[i] = static_cast<int>(n);
  }
  return v;
}
std::vector<int> displs(const std::vector<int>& counts, const char* call) {
  std::vector<int> d(counts.size());
  int64_t at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (at > INT_MAX) fail("%s: more than INT_MAX floats in one collective", call);
    d[i] = static_cast<int>(at);
    at += counts[i];
  }
  return d;
}

using Timed = CommTimer;

class MpiComm final : public Comm {
 public:
  MpiComm() {
    int inited = 0;
    check(MPI_Initialized(&inited), "MPI_Initialized");
    if (!inited) {
      int provided = 0;
      // SERIALIZED: one thread at a time, not always the one that initialised (a server's engine
      // thread runs the model; its main thread tells the followers to stop).
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      std::atexit([] {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Finalize();
      });
    }
    // generate / bench / perplexity need FUNNELED only; serve over ranks checks serialized().
    int level = 0;
    check(MPI_Query_thread(&level), "MPI_Query_thread");
    serialized_ = level >= MPI_THREAD_SERIALIZED;
    // Errors come back as return codes (check() turns them into spool::Error), not aborts.
    check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
  }
  int rank() const override { return rank_; }
  bool serialized() const override { return serialized_; }
  int size() const override { return size_; }
  const char* name() const override { return "mpi"; }

  std::vector<int64_t> allgather_rows(const float* rows, int64_t n_rows, int64_t width, std::vector<float>& out) override {
    Timed t(stats_);
    std::vector<int64_t> counts(static_cast<size_t>(size_));
    check(MPI_Allgather(&n_rows, 1, MPI_INT64_T, counts.data(), 1, MPI_INT64_T, MPI_COMM_WORLD), "MPI_Allgather");
    const std::vector<int> c = as_ints(counts, width, "allgather_rows"), d = displs(c, "allgather_rows");
    out.resize(static_cast<size_t>(std::accumulate(counts.begin(), counts.end(), int64_t{0}) * width));
    check(MPI_Allgatherv(rows, c[static_cast<size_t>(rank_)], MPI_FLOAT, out.data(), c.data(), d.data(), MPI_FLOAT, MPI_COMM_WORLD),
          "MPI_Allgatherv");
    t.received((out.size() - static_cast<size_t>(n_rows * width)) * sizeof(float));
    return counts;
  }

  void allgather_rows_in_place(float* buf, int64_t first, int64_t n_rows, int64_t total_rows, int64_t width) override {
    Timed t(stats_);
    std::vector<int64_t> counts(static_cast<size_t>(size_));
    check(MPI_Allgather(&n_rows, 1, MPI_INT64_T, counts.data(), 1, MPI_INT64_T, MPI_COMM_WORLD), "MPI_Allgather");
    int64_t at = 0;
    for (int r = 0; r < rank_; ++r) at += counts[static_cast<size_t>(r)];
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    if (at != first || total != total_rows)
      fail("allgather_rows_in_place: rank %d holds rows [%lld, %lld) and the ranks %lld rows in all, expected from %lld of %lld "
           "(do the ranks run the same model and inputs?)",
           rank_, (long long)first, (long long)(first + n_rows), (long long)total, (long long)at, (long long)total_rows);
    const std::vector<int> c = as_ints(counts, width, "allgather_rows_in_place"), d = displs(c, "allgather_rows_in_place");
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c.data(), d.data(), MPI_FLOAT, MPI_COMM_WORLD), "MPI_Allgatherv");
    t.received(static_cast<uint64_t>((total_rows - n_rows) * width) * sizeof(float));
  }

  void alltoall_rows(const float* send, std::span<const int64_t> send_counts, float* recv, std::span<const int64_t> recv_counts,
                     int64_t width) override {
    if (static_cast<int>(send_counts.size()) != size_ || static_cast<int>(recv_counts.size()) != size_)
      fail("alltoall_rows: %zu send and %zu receive counts for %d ranks", send_counts.size(), recv_counts.size(), size_);
    const std::vector<int> sc = as_ints(send_counts, width, "alltoall_rows"), rc = as_ints(recv_counts, width, "alltoall_rows");
    const std::vector<int> sd = displs(sc, "alltoall_rows"), rd = displs(rc, "alltoall_rows");
    Timed t(stats_);
    t.received(static_cast<uint64_t>(std::accumulate(rc.begin(), rc.end(), int64_t{0}) - rc[static_cast<size_t>(rank_)]) * sizeof(float));
    check(MPI_Alltoallv(send, sc.data(), sd.data(), MPI_FLOAT, recv, rc.data(), rd.data(), MPI_FLOAT, MPI_COMM_WORLD), "MPI_Alltoallv");
  }

  // Gathered, then summed in rank order on every rank: the same bits everywhere (an MPI_Allreduce
  // may add in a different order on different ranks).
  void allreduce_sum(float* x, int64_t n) override {
    std::vector<float> all;
    allgather_rows(x, 1, n, all);
    for (int64_t i = 0; i < n; ++i) {
      float s = all[static_cast<size_t>(i)];
      for (int r = 1; r < size_; ++r) s += all[static_cast<size_t>(r * n + i)];
      x[i] = s;
    }
  }

  void broadcast(void* p, size_t bytes, int root) override {
    if (root < 0 || root >= size_) fail("broadcast: root %d outside 0..%d", root, size_ - 1);
    Timed t(stats_);
    if (rank_ != root) t.received(bytes);
    auto* b = static_cast<char*>(p);
    for (size_t at = 0; at < bytes;) {  // (int counts: in pieces of at most 1 GiB)
      const int n = static_cast<int>(std::min<size_t>(bytes - at, size_t{1} << 30));
      check(MPI_Bcast(b + at, n, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
      at += static_cast<size_t>(n);
    }
  }

  void barrier() override {
    Timed t(stats_);
    check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
  }

  void broadcast_idle(void* p, size_t bytes, int root) override {
    if (root < 0 || root >= size_) fail("broadcast_idle: root %d outside 0..%d", root, size_ - 1);
    if (bytes > (size_t{1} << 30)) fail("broadcast_idle: %zu bytes (at most 1 GiB)", bytes);
    const auto t0 = std::chrono::steady_clock::now();
    MPI_Request req = MPI_REQUEST_NULL;
    check(MPI_Ibcast(p, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD, &req), "MPI_Ibcast");
    for (int done = 0;;) {
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) break;
      const auto waited = std::chrono::steady_clock::now() - t0;
      if (waited > std::chrono::seconds(1)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));  // idle: a first step after it waits 5 ms at most
      } else if (waited > std::chrono::milliseconds(20)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    // (Counted from the start: a follower's idle wait is time in collectives too.)
    ++stats_.calls;
    stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rank_ != root) stats_.bytes_received += bytes;
  }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // (MPI_Abort should not return)
  }

 private:
  int rank_ = 0, size_ = 1;
  bool serialized_ = false;  // MPI_THREAD_SERIALIZED or above given
};

}  // namespace

bool have_mpi() { return true; }

Comm& world() {
  static std::unique_ptr<Comm> w = launched_by_mpi() ? std::unique_ptr<Comm>(new MpiComm()) : self_comm();
  return *w;
}

}  // namespace spool::dist
