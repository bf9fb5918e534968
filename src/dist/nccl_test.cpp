// The NCCL communicator on a GPU (GPU tests: each is SKIPPED without a CUDA device, like
// cuda_model_test; scripts/test-cuda.sh runs them on a GPU machine): dist::nccl_comm over the
// ranks of dist::world() (one rank alone; under `mpirun -n N` with N GPUs, one GPU per rank),
// every collective on device memory against the values computed on the host (in-place gathers,
// zero-row counts, mismatched counts refused), and fixture models run expert parallel on
// CudaBackend with the NCCL communicator (one rank forced through the exchange path) bit for bit
// against the plain CUDA run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "common/error.h"
#include "dist/comm.h"
#include "dist/expert_parallel.h"
#include "dist/nccl_comm.h"
#include "experts/device_experts.h"
#include "io/checkpoint.h"
#include "models/family.h"
#include "models/greedy_logits.h"
#include "models/model.h"
#include "ops/cuda/cuda_backend.h"
#include "support/golden.h"

namespace spool::dist {
namespace {

using models::greedy_logits;

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// A device buffer of n T, freed at scope exit.
template <class T>
struct DevBuf {
  T* p = nullptr;
  explicit DevBuf(size_t n) {
    if (cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) p = nullptr;
  }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

// The world's ranks over NCCL on this rank's GPU (rank mod the GPUs seen) and a stream of its own.
struct Fixture {
  cudaStream_t s = nullptr;
  std::unique_ptr<Comm> comm;
  Fixture() {
    int n = 0;
    cudaGetDeviceCount(&n);
    const int dev = world().rank() % std::max(n, 1);
    cudaSetDevice(dev);
    cudaStreamCreate(&s);
    comm = nccl_comm(world(), dev, s);
  }
  ~Fixture() {
    comm.reset();
    cudaStreamDestroy(s);
  }
};

bool no_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) != cudaSuccess || n == 0;
}
#define SKIP_WITHOUT_GPU() \
  if (no_gpu()) GTEST_SKIP() << "no CUDA device on this machine: the NCCL communicator not checked"

// Rank r's row i of `width`: values no other rank or row has.
float value(int r, int64_t i, int64_t j) { return static_cast<float>(r * 1000 + i * 10 + j) + 0.25f; }
std::vector<float> rows_of(int r, int64_t n, int64_t width) {
  std::vector<float> v(static_cast<size_t>(n * width));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < width; ++j) v[static_cast<size_t>(i * width + j)] = value(r, i, j);
  return v;
}
int64_t rows_for(int r) { return (r * 3 + 2) % 5; }  // uneven counts: 2, 0 (rank 1: none), 3, 1, ...

TEST(NcclComm, OneCommunicatorOverTheWorld) {
  SKIP_WITHOUT_GPU();
  Fixture f;
  EXPECT_EQ(f.comm->rank(), world().rank());
  EXPECT_EQ(f.comm->size(), world().size());
  EXPECT_STREQ(f.comm->name(), "nccl");
  EXPECT_TRUE(f.comm->device_memory());
  EXPECT_TRUE(have_nccl());
}

TEST(NcclComm, AllgatherRowsInPlaceOnTheDevice) {
  SKIP_WITHOUT_GPU();
  Fixture f;
  const int R = f.comm->size(), me = f.comm->rank();
  const int64_t W = 7;
  for (const bool with_empty : {false, true}) {
    SCOPED_TRACE(with_empty ? "no rows on the even ranks" : "uneven counts");
    std::vector<int64_t> counts(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) counts[static_cast<size_t>(r)] = with_empty && r % 2 == 0 ? 0 : rows_for(r) + 1;
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    int64_t first = 0;
    for (int r = 0; r < me; ++r) first += counts[static_cast<size_t>(r)];
    std::vector<float> want;
    for (int r = 0; r < R; ++r) {
      const std::vector<float> v = rows_of(r, counts[static_cast<size_t>(r)], W);
      want.insert(want.end(), v.begin(), v.end());
    }
    // The buffer: this rank's rows in place, every other row garbage (-1) to be overwritten.
    std::vector<float> h(static_cast<size_t>(total * W), -1.0f);
    const std::vector<float> mine = rows_of(me, counts[static_cast<size_t>(me)], W);
    std::copy(mine.begin(), mine.end(), h.begin() + first * W);
    DevBuf<float> d(h.size());
    ASSERT_NE(d.p, nullptr);
    CUDA_OK(cudaMemcpy(d.p, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    const uint64_t bytes0 = f.comm->stats().bytes_received, calls0 = f.comm->stats().calls;
    f.comm->allgather_rows_in_place(d.p, first, counts[static_cast<size_t>(me)], total, W);
    CUDA_OK(cudaStreamSynchronize(f.s));
    std::vector<float> got(h.size());
    CUDA_OK(cudaMemcpy(got.data(), d.p, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, want);
    EXPECT_EQ(f.comm->stats().calls, calls0 + 1);
    EXPECT_EQ(f.comm->stats().bytes_received - bytes0, static_cast<uint64_t>((total - counts[static_cast<size_t>(me)]) * W) * sizeof(float));
  }
  // Ranges that do not tile the rows: every rank throws (the counts are gathered first).
  DevBuf<float> d(64);
  EXPECT_THROW(f.comm->allgather_rows_in_place(d.p, 0, 2, 2 * R + 1, 4), Error);
  EXPECT_THROW(f.comm->allgather_rows_in_place(d.p, 2 * me + 1, 2, 2 * R, 4), Error);  // (every rank off by one)
}

TEST(NcclComm, AllgatherRowsToTheHost) {
  SKIP_WITHOUT_GPU();
  Fixture f;
  const int R = f.comm->size(), me = f.comm->rank();
  const int64_t W = 5;
  const std::vector<float> mine = rows_of(me, rows_for(me), W);
  DevBuf<float> d(mine.size());
  CUDA_OK(cudaMemcpy(d.p, mine.data(), mine.size() * sizeof(float), cudaMemcpyHostToDevice));
  std::vector<float> out = {42.0f};
  const std::vector<int64_t> counts = f.comm->allgather_rows(d.p, rows_for(me), W, out);
  std::vector<float> want;
  std::vector<int64_t> want_counts;
  for (int r = 0; r < R; ++r) {
    const std::vector<float> v = rows_of(r, rows_for(r), W);
    want.insert(want.end(), v.begin(), v.end());
    want_counts.push_back(rows_for(r));
  }
  EXPECT_EQ(counts, want_counts);
  EXPECT_EQ(out, want);
  // No rows anywhere: an empty result.
  const std::vector<int64_t> none = f.comm->allgather_rows(d.p, 0, W, out);
  EXPECT_EQ(none, std::vector<int64_t>(static_cast<size_t>(R), 0));
  EXPECT_TRUE(out.empty());
}

TEST(NcclComm, AlltoallRowsWithZeroRowCounts) {
  SKIP_WITHOUT_GPU();
  Fixture f;
  const int R = f.comm->size(), me = f.comm->rank();
  const int64_t W = 3;
  // Rank a sends (a + 2 b + 1) % 3 rows to rank b (one to itself on one rank; zeros among them with
  // more); row i of a's rows to b holds value(a, 100 b + i, j).
  const auto n_send = [](int a, int b) { return static_cast<int64_t>((a + 2 * b + 1) % 3); };
  for (const bool all_zero : {false, true}) {
    SCOPED_TRACE(all_zero ? "no rows at all" : "counts (a + 2b + 1) % 3");
    std::vector<int64_t> sc(static_cast<size_t>(R)), rc(static_cast<size_t>(R));
    std::vector<float> send, want;
    for (int b = 0; b < R; ++b) {
      sc[static_cast<size_t>(b)] = all_zero ? 0 : n_send(me, b);
      for (int64_t i = 0; i < sc[static_cast<size_t>(b)]; ++i)
        for (int64_t j = 0; j < W; ++j) send.push_back(value(me, 100 * b + i, j));
    }
    for (int a = 0; a < R; ++a) {
      rc[static_cast<size_t>(a)] = all_zero ? 0 : n_send(a, me);
      for (int64_t i = 0; i < rc[static_cast<size_t>(a)]; ++i)
        for (int64_t j = 0; j < W; ++j) want.push_back(value(a, 100 * me + i, j));
    }
    DevBuf<float> ds(send.size()), dr(want.size() + 1);
    if (!send.empty()) {
      CUDA_OK(cudaMemcpy(ds.p, send.data(), send.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    const float sentinel = -7.0f;  // the float after the received rows stays untouched
    CUDA_OK(cudaMemcpy(dr.p + want.size(), &sentinel, sizeof(float), cudaMemcpyHostToDevice));
    f.comm->alltoall_rows(ds.p, sc, dr.p, rc, W);
    CUDA_OK(cudaStreamSynchronize(f.s));
    std::vector<float> got(want.size() + 1);
    CUDA_OK(cudaMemcpy(got.data(), dr.p, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::vector<float>(got.begin(), got.end() - 1), want);
    EXPECT_EQ(got.back(), sentinel);
  }
  // Counts that do not agree (this rank expects one row more from rank 0 than it sends): refused.
  std::vector<int64_t> sc(static_cast<size_t>(R), 0), rc(static_cast<size_t>(R), 0);
  rc[0] = 1;
  DevBuf<float> d(16);
  EXPECT_THROW(f.comm->alltoall_rows(d.p, sc, d.p + 8, rc, 2), Error);
  EXPECT_THROW(f.comm->alltoall_rows(d.p, std::vector<int64_t>(static_cast<size_t>(R) + 1, 0), d.p, rc, 2), Error);
}

TEST(NcclComm, AllreduceBroadcastBarrier) {
  SKIP_WITHOUT_GPU();
  Fixture f;
  const int R = f.comm->size(), me = f.comm->rank();
  const int64_t n = 1000;
  std::vector<float> x(static_cast<size_t>(n)), want(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = 0.1f * static_cast<float>(i) + 0.01f * static_cast<float>(me);
  for (int64_t i = 0; i < n; ++i) {  // summed in rank order, as the host would
    float s = 0.1f * static_cast<float>(i);
    for (int r = 1; r < R; ++r) s += 0.1f * static_cast<float>(i) + 0.01f * static_cast<float>(r);
    want[static_cast<size_t>(i)] = s;
  }
  DevBuf<float> d(x.size());
  CUDA_OK(cudaMemcpy(d.p, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  f.comm->allreduce_sum(d.p, n);
  CUDA_OK(cudaStreamSynchronize(f.s));
  std::vector<float> got(x.size());
  CUDA_OK(cudaMemcpy(got.data(), d.p, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, want);

  // Broadcast from the last rank: its bytes everywhere.
  const int root = R - 1;
  std::vector<unsigned char> b(37);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<unsigned char>(me == root ? 3 * i + 1 : 0xee);
  DevBuf<unsigned char> db(b.size());
  CUDA_OK(cudaMemcpy(db.p, b.data(), b.size(), cudaMemcpyHostToDevice));
  f.comm->broadcast(db.p, b.size(), root);
  CUDA_OK(cudaStreamSynchronize(f.s));
  std::vector<unsigned char> gb(b.size());
  CUDA_OK(cudaMemcpy(gb.data(), db.p, gb.size(), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < gb.size(); ++i) EXPECT_EQ(gb[i], static_cast<unsigned char>(3 * i + 1)) << i;
  EXPECT_THROW(f.comm->broadcast(db.p, 4, R), Error);
  EXPECT_THROW(f.comm->broadcast(db.p, 4, -1), Error);

  const uint64_t calls = f.comm->stats().calls;
  f.comm->barrier();
  EXPECT_EQ(f.comm->stats().calls, calls + 1);
}

// Fixture models on CudaBackend, experts in VRAM: run expert parallel over the NCCL communicator
// (one rank: forced through the exchange path; several: each rank its share, owners balanced by
// a made-up load so that they are not contiguous) against the plain CUDA run, bit for bit.
std::vector<float> prompt_logits(models::Model& m, const std::vector<int32_t>& ids) {
  std::vector<float> out(ids.size() * static_cast<size_t>(m.spec().vocab_size));
  models::State st = m.new_state();
  m.forward(ids, st, models::LogitsMode::kAll, out.data());
  return out;
}

void experts_to_vram(models::Model& m, ops::CudaBackend& be) {
  const models::ModelSpec& s = m.spec();
  std::vector<bool> moe(static_cast<size_t>(s.n_layers));
  for (int i = 0; i < s.n_layers; ++i) moe[static_cast<size_t>(i)] = s.ffns[static_cast<size_t>(i)] == models::FfnKind::kMoE;
  m.set_expert_provider(std::make_shared<experts::DeviceExperts>(m.expert_provider(), be, moe, s.moe.n_experts));
}

class NcclExpertParallel : public ::testing::TestWithParam<std::string> {};

TEST_P(NcclExpertParallel, MatchesThePlainCudaRunBitForBit) {
  SKIP_WITHOUT_GPU();
  const std::string dir = spool::testing::data_dir() + "/models/" + GetParam();
  auto ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(dir));
  int n = 0;
  cudaGetDeviceCount(&n);
  auto be = std::make_shared<ops::CudaBackend>(world().rank() % std::max(n, 1));
  auto plain = models::load_model(ckpt, be);
  auto ep_model = models::load_model(ckpt, be);
  experts_to_vram(*plain, *be);
  experts_to_vram(*ep_model, *be);
  std::unique_ptr<Comm> comm = nccl_comm(world(), be->device_index(), be->stream_handle());
  const models::ModelSpec& s = plain->spec();
  ExpertParallel ep;
  ep.comm = comm.get();
  ep.one_rank_exchange = true;
  if (comm->size() > 1) {  // a map that is not contiguous blocks: load e % 3 + e / 7 (ties broken by id)
    std::vector<std::vector<double>> load(static_cast<size_t>(s.n_layers + s.mtp_layers));
    for (auto& l : load)
      for (int e = 0; e < s.moe.n_experts; ++e) l.push_back(static_cast<double>(e % 3 + e / 7));
    ep.owners = std::make_shared<const ExpertOwners>(ExpertOwners::balanced(load, s.moe.n_experts, comm->size()));
  }
  ep_model->set_expert_parallel(ep);
  spool::testing::Golden g(dir + "/golden.safetensors");
  const std::vector<int32_t> ids = g.i32("input_ids");
  const std::vector<float> a = prompt_logits(*plain, ids), b = prompt_logits(*ep_model, ids);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "prompt logits";
  const std::vector<float> ga = greedy_logits(*plain, ids, 6), gb = greedy_logits(*ep_model, ids, 6);
  ASSERT_EQ(ga.size(), gb.size());
  EXPECT_EQ(std::memcmp(ga.data(), gb.data(), ga.size() * sizeof(float)), 0) << "greedy decode logits";
  EXPECT_GT(comm->stats().calls, 0u) << "the exchange path did not run";
  // The CPU's communicator (host memory) is refused on the GPU backend.
  ExpertParallel host;
  host.comm = &world();
  host.one_rank_exchange = true;
  EXPECT_THROW(ep_model->set_expert_parallel(host), Error);
}

INSTANTIATE_TEST_SUITE_P(Families, NcclExpertParallel,
                         ::testing::Values("qwen3_moe", "deepseek_v3", "gpt_oss", "mixtral", "qwen3_5_moe_text", "gemma4_text_moe"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace spool::dist
