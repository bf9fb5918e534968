// The communicator seam of expert parallelism (docs/distributed.md): a group of `size` processes
// (ranks) that run one model in lockstep, each holding a share of the routed experts. One small
// interface with a single-process implementation (no library), an MPI one (Open MPI, host
// memory; built when the MPI development files are found: SPOOL_HAVE_MPI) and an NCCL one (device
// memory: dist/nccl_comm.h, SPOOL_HAVE_NCCL). No wire protocol of spool's own: every byte between
// ranks goes through the library.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace spool::dist {

/// What a communicator has moved so far (this rank's view).
struct CommStats {
  uint64_t calls = 0;           ///< collectives
  uint64_t bytes_received = 0;  ///< payload bytes that came from other ranks
  double seconds = 0;           ///< wall time inside the collectives (waiting for the other ranks included)
};

/// A communicator. Every collective must be called by every rank in the same order with
/// matching arguments (the MPI rule); a library error throws spool::Error naming the call.
class Comm {
 public:
  virtual ~Comm() = default;
  /// Counters since the start (CommStats).
  const CommStats& stats() const { return stats_; }
  /// This process's rank, 0 .. size() - 1.
  virtual int rank() const = 0;
  /// Number of ranks (1: a single process).
  virtual int size() const = 0;
  /// "self", "mpi" or "nccl" (logs, doctor).
  virtual const char* name() const = 0;
  /// True when the collectives' pointers are device memory (NcclComm: rows, x, p; queued on its
  /// stream, so on return they may still be running, except where noted), false for host memory.
  virtual bool device_memory() const { return false; }
  /// Whether collectives may come from different threads, one at a time (MPI_THREAD_SERIALIZED;
  /// serve over ranks needs it: its engine thread runs the model, its main thread stops the ranks).
  virtual bool serialized() const { return true; }
  /// Every rank's `n_rows` rows of `width` floats, concatenated in rank order, into `out` (resized
  /// to the total; every rank gets the same bytes). Returns each rank's row count. (NcclComm:
  /// rows on the device, `out` on the host, complete on return.)
  virtual std::vector<int64_t> allgather_rows(const float* rows, int64_t n_rows, int64_t width, std::vector<float>& out) = 0;
  /// The same in place: buf holds total_rows rows of `width` floats, this rank's n_rows of them
  /// from row `first` on; on return every rank's rows are in place (MPI_IN_PLACE: no staging copy).
  /// The ranks' ranges must tile [0, total_rows) in rank order; throws spool::Error naming the
  /// mismatch otherwise (ranks not running the same model and inputs).
  virtual void allgather_rows_in_place(float* buf, int64_t first, int64_t n_rows, int64_t total_rows, int64_t width) = 0;
  /// Rows to each rank and back: send holds send_counts[r] rows of `width` floats for rank r,
  /// concatenated in rank order; recv (recv_counts[r] rows from rank r, in rank order) must hold
  /// the sum of recv_counts rows. The counts must agree pairwise (rank a's send_counts[b] ==
  /// rank b's recv_counts[a]).
  virtual void alltoall_rows(const float* send, std::span<const int64_t> send_counts, float* recv, std::span<const int64_t> recv_counts,
                             int64_t width) = 0;
  /// x[0, n) summed over the ranks, in rank order, into every rank's x (the same bits everywhere).
  virtual void allreduce_sum(float* x, int64_t n) = 0;
  /// root's `bytes` bytes at p into every rank's p.
  virtual void broadcast(void* p, size_t bytes, int root) = 0;
  /// Returns when every rank has called it.
  virtual void barrier() = 0;
  /// broadcast() for ranks that may wait long (a follower between a server's requests): a waiting
  /// rank polls the transfer and sleeps between polls once it has waited 20 ms (a millisecond at
  /// a time; 5 ms after a second), instead of spinning on a core. Every rank of one such broadcast must call
  /// broadcast_idle (MPI matches a nonblocking collective only with nonblocking ones). Bytes up to
  /// 1 GiB.
  virtual void broadcast_idle(void* p, size_t bytes, int root) { broadcast(p, bytes, root); }
  /// Ends the processes of every rank with exit status `code` (MPI_Abort): for an error after
  /// which the ranks cannot stay in step. Does not return.
  [[noreturn]] virtual void abort(int code) = 0;

 protected:
  CommStats stats_;
};

/// Counts one collective into a CommStats (the implementations' helper): one call, its wall time
/// at scope exit (host time: for a device communicator, queueing plus any wait), and the payload
/// bytes given to received().
class CommTimer {
 public:
  explicit CommTimer(CommStats& s) : s_(s), t0_(std::chrono::steady_clock::now()) { ++s_.calls; }
  ~CommTimer() { s_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  CommTimer(const CommTimer&) = delete;
  CommTimer& operator=(const CommTimer&) = delete;
  /// Adds `bytes` that came from other ranks.
  void received(uint64_t bytes) { s_.bytes_received += bytes; }

 private:
  CommStats& s_;
  std::chrono::steady_clock::time_point t0_;
};

/// A communicator of one rank (every collective is a copy or nothing).
std::unique_ptr<Comm> self_comm();

/// True when this build has the MPI implementation.
bool have_mpi();

/// True when this process was started by an MPI launcher with more than one rank
/// (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_SIZE above 1 in the environment).
bool launched_by_mpi();

/// The process's communicator: MPI's world when launched_by_mpi() (throws spool::Error when this
/// build has no MPI), else self_comm(). MPI is initialised on the first call and finalised at exit.
Comm& world();

/// The rank that owns routed expert e of n_experts over `ranks` ranks: contiguous blocks,
/// owner(e) = floor(e * ranks / n_experts), so each rank's experts are one ascending range.
inline int expert_owner(int e, int n_experts, int ranks) {
  return static_cast<int>(static_cast<int64_t>(e) * ranks / n_experts);
}

/// The experts expert_owner() gives `rank`: [first, last) = [ceil(rank E / R), ceil((rank + 1) E / R)).
inline std::pair<int, int> owned_experts(int rank, int n_experts, int ranks) {
  const auto at = [&](int r) { return static_cast<int>((static_cast<int64_t>(n_experts) * r + ranks - 1) / ranks); };
  return {at(rank), at(rank + 1)};
}

}  // namespace spool::dist
