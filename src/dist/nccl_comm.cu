// The NCCL communicator: dist::Comm on device memory (nccl_comm.h). NCCL has no all-gather with
// per-rank counts (MPI's Allgatherv), so a gather of token rows first gathers the row counts
// (ncclAllGather of one int64 per rank, read on the host: one stream sync per gather), then
// broadcasts each rank's rows in place from that rank (ncclBroadcast per rank with rows, grouped
// with ncclGroupStart / ncclGroupEnd so NCCL runs them together). Grouped broadcasts rather than a
// padded ncclAllGather: no padding rows to allocate, send and compact again when the ranks' counts
// differ (they usually do: routing is uneven), and the rows land in place. The counts round trip
// is also what makes a failed rank (0 rows) visible to every rank, as with MPI.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>

#include "common/error.h"
#include "dist/nccl_comm.h"

namespace spool::dist {

namespace {

void check(ncclResult_t rc, const char* call) {
  if (rc != ncclSuccess) fail("%s failed: %s", call, ncclGetErrorString(rc));
}
void check_cuda(cudaError_t rc, const char* call) {
  if (rc != cudaSuccess) fail("%s failed: %s", call, cudaGetErrorString(rc));
}

// x[i] = all[0 n + i] + all[1 n + i] + ... in rank order (MpiComm::allreduce_sum's order).
__global__ void k_sum_ranks(const float* all, int R, int64_t n, float* x) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = all[i];
    for (int r = 1; r < R; ++r) s += all[static_cast<int64_t>(r) * n + i];
    x[i] = s;
  }
}

using Timed = CommTimer;

// ncclGroupStart .. ncclGroupEnd around f(); the group is closed even when f throws.
template <class F>
void grouped(F&& f) {
  check(ncclGroupStart(), "ncclGroupStart");
  try {
    f();
  } catch (...) {
    ncclGroupEnd();
    throw;
  }
  check(ncclGroupEnd(), "ncclGroupEnd");
}

class NcclComm final : public Comm {
 public:
  NcclComm(Comm& host, int device, cudaStream_t s) : host_(host), s_(s), device_(device), rank_(host.rank()), size_(host.size()) {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    // Rank 0's id (and whether it got one) to every rank: a failure there fails every rank.
    struct {
      int64_t ok;
      ncclUniqueId id;
    } boot{};
    std::string err;
    if (rank_ == 0) {
      const ncclResult_t rc = ncclGetUniqueId(&boot.id);
      boot.ok = rc == ncclSuccess;
      if (!boot.ok) err = ncclGetErrorString(rc);
    }
    if (size_ > 1) host.broadcast(&boot, sizeof(boot), 0);
    if (!boot.ok) fail("ncclGetUniqueId failed%s%s", rank_ == 0 ? ": " : " on rank 0", err.c_str());
    check(ncclCommInitRank(&comm_, size_, boot.id, rank_), "ncclCommInitRank");
    const size_t n = static_cast<size_t>(size_) * (1 + static_cast<size_t>(size_));
    try {
      check_cuda(cudaMalloc(&counts_dev_, n * sizeof(int64_t)), "cudaMalloc");
      check_cuda(cudaMallocHost(&counts_host_, n * sizeof(int64_t)), "cudaMallocHost");
    } catch (...) {
      release();
      throw;
    }
  }
  ~NcclComm() override { release(); }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "nccl"; }
  bool device_memory() const override { return true; }

  std::vector<int64_t> allgather_rows(const float* rows, int64_t n_rows, int64_t width, std::vector<float>& out) override {
    if (n_rows < 0 || width < 0) fail("allgather_rows: %lld rows of %lld floats", (long long)n_rows, (long long)width);
    Timed t(stats_);
    const std::vector<int64_t> counts = gather_counts(&n_rows, 1);
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    int64_t at = 0;
    for (int r = 0; r < rank_; ++r) at += counts[static_cast<size_t>(r)];
    float* buf = scratch(static_cast<size_t>(total * width));
    if (n_rows > 0)
      check_cuda(cudaMemcpyAsync(buf + at * width, rows, static_cast<size_t>(n_rows * width) * sizeof(float), cudaMemcpyDeviceToDevice, s_),
                 "cudaMemcpyAsync");
    broadcast_rows(buf, counts, width);
    out.resize(static_cast<size_t>(total * width));
    if (!out.empty())
      check_cuda(cudaMemcpyAsync(out.data(), buf, out.size() * sizeof(float), cudaMemcpyDeviceToHost, s_), "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(s_), "cudaStreamSynchronize");
    t.received(static_cast<uint64_t>((total - n_rows) * width) * sizeof(float));
    return counts;
  }

  void allgather_rows_in_place(float* buf, int64_t first, int64_t n_rows, int64_t total_rows, int64_t width) override {
    Timed t(stats_);
    const std::vector<int64_t> counts = gather_counts(&n_rows, 1);
    int64_t at = 0;
    for (int r = 0; r < rank_; ++r) at += counts[static_cast<size_t>(r)];
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    if (at != first || total != total_rows || n_rows < 0 || width < 0)
      fail("allgather_rows_in_place: rank %d holds rows [%lld, %lld) and the ranks %lld rows in all, expected from %lld of %lld "
           "(do the ranks run the same model and inputs?)",
           rank_, (long long)first, (long long)(first + n_rows), (long long)total, (long long)at, (long long)total_rows);
    broadcast_rows(buf, counts, width);
    t.received(static_cast<uint64_t>((total_rows - n_rows) * width) * sizeof(float));
  }

  void alltoall_rows(const float* send, std::span<const int64_t> send_counts, float* recv, std::span<const int64_t> recv_counts,
                     int64_t width) override {
    if (static_cast<int>(send_counts.size()) != size_ || static_cast<int>(recv_counts.size()) != size_)
      fail("alltoall_rows: %zu send and %zu receive counts for %d ranks", send_counts.size(), recv_counts.size(), size_);
    for (int r = 0; r < size_; ++r)
      if (send_counts[static_cast<size_t>(r)] < 0 || recv_counts[static_cast<size_t>(r)] < 0)
        fail("alltoall_rows: a negative row count for rank %d", r);
    Timed t(stats_);
    // Every rank's send counts (R x R, read on the host): the pairs must agree, or NCCL would
    // wait for rows that never come.
    const std::vector<int64_t> all = gather_counts(send_counts.data(), size_);
    for (int r = 0; r < size_; ++r) {
      const int64_t sent = all[static_cast<size_t>(r) * static_cast<size_t>(size_) + static_cast<size_t>(rank_)];
      if (sent != recv_counts[static_cast<size_t>(r)])
        fail("alltoall_rows: rank %d sends %lld rows to rank %d, which expects %lld", r, (long long)sent, rank_,
             (long long)recv_counts[static_cast<size_t>(r)]);
    }
    std::vector<int64_t> sd(static_cast<size_t>(size_)), rd(static_cast<size_t>(size_));
    int64_t s_at = 0, r_at = 0, got = 0;
    for (int r = 0; r < size_; ++r) {
      sd[static_cast<size_t>(r)] = s_at;
      rd[static_cast<size_t>(r)] = r_at;
      s_at += send_counts[static_cast<size_t>(r)] * width;
      r_at += recv_counts[static_cast<size_t>(r)] * width;
      if (r != rank_) got += recv_counts[static_cast<size_t>(r)] * width;
    }
    const int64_t self = send_counts[static_cast<size_t>(rank_)] * width;  // (this rank's own rows: a device copy)
    if (self > 0)
      check_cuda(cudaMemcpyAsync(recv + rd[static_cast<size_t>(rank_)], send + sd[static_cast<size_t>(rank_)], static_cast<size_t>(self) * sizeof(float),
                                 cudaMemcpyDeviceToDevice, s_),
                 "cudaMemcpyAsync");
    grouped([&] {
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        const int64_t ns = send_counts[static_cast<size_t>(r)] * width, nr = recv_counts[static_cast<size_t>(r)] * width;
        if (ns > 0) check(ncclSend(send + sd[static_cast<size_t>(r)], static_cast<size_t>(ns), ncclFloat, r, comm_, s_), "ncclSend");
        if (nr > 0) check(ncclRecv(recv + rd[static_cast<size_t>(r)], static_cast<size_t>(nr), ncclFloat, r, comm_, s_), "ncclRecv");
      }
    });
    t.received(static_cast<uint64_t>(got) * sizeof(float));
  }

  // Gathered, then summed in rank order on every rank (one kernel): the same bits everywhere, and
  // the bits of MpiComm::allreduce_sum (a ring all-reduce adds in another order per element).
  void allreduce_sum(float* x, int64_t n) override {
    if (n < 0) fail("allreduce_sum: %lld floats", (long long)n);
    if (n == 0) return;
    Timed t(stats_);
    float* all = scratch(static_cast<size_t>(size_) * static_cast<size_t>(n));
    check(ncclAllGather(x, all, static_cast<size_t>(n), ncclFloat, comm_, s_), "ncclAllGather");
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");  // (the launch goes to this thread's current device)
    const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 4096));
    k_sum_ranks<<<blocks, 256, 0, s_>>>(all, size_, n, x);
    check_cuda(cudaGetLastError(), "k_sum_ranks launch");
    t.received(static_cast<uint64_t>(size_ - 1) * static_cast<uint64_t>(n) * sizeof(float));
  }

  void broadcast(void* p, size_t bytes, int root) override {
    if (root < 0 || root >= size_) fail("broadcast: root %d outside 0..%d", root, size_ - 1);
    if (bytes == 0) return;
    Timed t(stats_);
    if (rank_ != root) t.received(bytes);
    check(ncclBroadcast(p, p, bytes, ncclUint8, root, comm_, s_), "ncclBroadcast");
  }

  // NCCL has no barrier: a one-element all-reduce, waited for on the host.
  void barrier() override {
    Timed t(stats_);
    check(ncclAllReduce(counts_dev_, counts_dev_, 1, ncclInt64, ncclSum, comm_, s_), "ncclAllReduce");
    check_cuda(cudaStreamSynchronize(s_), "cudaStreamSynchronize");
  }

  [[noreturn]] void abort(int code) override {
    ncclCommAbort(comm_);
    comm_ = nullptr;
    if (host_.size() > 1) host_.abort(code);
    std::_Exit(code);
  }

 private:
  // Every rank's `per` int64s (this rank's from `mine`), in rank order, read on the host: the
  // stream is synchronised (the gather and everything queued before it have run).
  std::vector<int64_t> gather_counts(const int64_t* mine, int per) {
    const size_t R = static_cast<size_t>(size_), p = static_cast<size_t>(per);
    std::memcpy(counts_host_, mine, p * sizeof(int64_t));
    check_cuda(cudaMemcpyAsync(counts_dev_, counts_host_, p * sizeof(int64_t), cudaMemcpyHostToDevice, s_), "cudaMemcpyAsync");
    check(ncclAllGather(counts_dev_, counts_dev_ + R, p, ncclInt64, comm_, s_), "ncclAllGather");
    check_cuda(cudaMemcpyAsync(counts_host_ + R, counts_dev_ + R, R * p * sizeof(int64_t), cudaMemcpyDeviceToHost, s_), "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(s_), "cudaStreamSynchronize");
    return std::vector<int64_t>(counts_host_ + R, counts_host_ + R + R * p);
  }

  // buf holds the ranks' rows in rank order (counts[r] rows of `width` from rank r): each rank's
  // rows broadcast in place from that rank, one NCCL group.
  void broadcast_rows(float* buf, const std::vector<int64_t>& counts, int64_t width) {
    grouped([&] {
      int64_t at = 0;
      for (int r = 0; r < size_; ++r) {
        const int64_t n = counts[static_cast<size_t>(r)] * width;
        if (n > 0) check(ncclBroadcast(buf + at, buf + at, static_cast<size_t>(n), ncclFloat, r, comm_, s_), "ncclBroadcast");
        at += n;
      }
    });
  }

  // A device buffer of at least n floats (grown after the stream's queued work that may read the
  // old one has run).
  float* scratch(size_t n) {
    if (n > scratch_n_) {
      if (scratch_ != nullptr) {
        check_cuda(cudaStreamSynchronize(s_), "cudaStreamSynchronize");
        cudaFree(scratch_);
        scratch_ = nullptr;
        scratch_n_ = 0;
      }
      check_cuda(cudaMalloc(&scratch_, n * sizeof(float)), "cudaMalloc");
      scratch_n_ = n;
    }
    return scratch_;
  }

  // (The stream belongs to the caller and may be gone: a wait for this communicator's whole
  // device — made current first, as the thread may be on another — errors ignored.)
  void release() {
    cudaSetDevice(device_);
    cudaDeviceSynchronize();
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (counts_dev_ != nullptr) cudaFree(counts_dev_);
    if (counts_host_ != nullptr) cudaFreeHost(counts_host_);
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    scratch_ = nullptr;
    counts_dev_ = nullptr;
    counts_host_ = nullptr;
    comm_ = nullptr;
  }

  Comm& host_;
  cudaStream_t s_;
  int device_ = 0;
  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  int64_t* counts_dev_ = nullptr;   // [R] this rank's counts, then [R * R] every rank's
  int64_t* counts_host_ = nullptr;  // page-locked mirror of counts_dev_
  float* scratch_ = nullptr;        // allgather_rows' and allreduce_sum's gathers
  size_t scratch_n_ = 0;
};

}  // namespace

bool have_nccl() { return true; }

std::unique_ptr<Comm> nccl_comm(Comm& host, int device, void* stream) {
  return std::make_unique<NcclComm>(host, device, static_cast<cudaStream_t>(stream));
}

}  // namespace spool::dist
