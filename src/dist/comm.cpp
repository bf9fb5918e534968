#include "dist/comm.h"

#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "dist/nccl_comm.h"

namespace spool::dist {

namespace {

class SelfComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* name() const override { return "self"; }
  std::vector<int64_t> allgather_rows(const float* rows, int64_t n_rows, int64_t width, std::vector<float>& out) override {
    out.assign(rows, rows + n_rows * width);
    return {n_rows};
  }
  void allgather_rows_in_place(float*, int64_t first, int64_t n_rows, int64_t total_rows, int64_t) override {
    if (first != 0 || n_rows != total_rows)
      fail("allgather_rows_in_place: one rank holds rows [%lld, %lld) of %lld", (long long)first, (long long)(first + n_rows), (long long)total_rows);
  }
  void alltoall_rows(const float* send, std::span<const int64_t> send_counts, float* recv, std::span<const int64_t> recv_counts,
                     int64_t width) override {
    if (send_counts.size() != 1 || recv_counts.size() != 1 || send_counts[0] != recv_counts[0])
      fail("alltoall_rows: one rank sends %lld rows to itself and expects %lld", send_counts.empty() ? -1LL : (long long)send_counts[0],
           recv_counts.empty() ? -1LL : (long long)recv_counts[0]);
    if (send_counts[0] > 0) std::memmove(recv, send, static_cast<size_t>(send_counts[0] * width) * sizeof(float));
  }
  void allreduce_sum(float*, int64_t) override {}
  void broadcast(void*, size_t, int root) override {
    if (root != 0) fail("broadcast: root %d of a single-rank communicator", root);
  }
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
};

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : 0;
}

}  // namespace

std::unique_ptr<Comm> self_comm() { return std::make_unique<SelfComm>(); }

bool launched_by_mpi() { return env_int("OMPI_COMM_WORLD_SIZE") > 1 || env_int("PMI_SIZE") > 1 || env_int("PMIX_SIZE") > 1; }

#ifndef SPOOL_HAVE_MPI
bool have_mpi() { return false; }

Comm& world() {
  if (launched_by_mpi())
    fail("this process was started by an MPI launcher with several ranks, but this spool was built without MPI "
         "(install libopenmpi-dev and rebuild: scripts/setup.sh)");
  static SelfComm self;
  return self;
}
#endif

#ifndef SPOOL_HAVE_NCCL
bool have_nccl() { return false; }

std::unique_ptr<Comm> nccl_comm(Comm&, int, void*) {
  fail("--comm nccl: this spool was built without NCCL (a CUDA build with NCCL's nccl.h and libnccl found: SPOOL_NCCL)");
}
#endif

}  // namespace spool::dist
