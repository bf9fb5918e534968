// engine::host_fallback_line: the loader's line naming the ops of a model that a device backend
// runs on the host (a backend standing in for a GPU one: the generic fallbacks left in place).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "models/family.h"
#include "support/golden.h"
#include "engine/loader.h"
#include "io/checkpoint.h"
#include "models/spec.h"
#include "ops/cpu_backend.h"

namespace spool::engine {
namespace {

// A CpuBackend that says it leaves the generic ops on the host (as CudaBackend does today).
class FallbackBackend : public ops::CpuBackend {
 public:
  FallbackBackend() : ops::CpuBackend(nullptr) {}
  const char* name() const override { return "fakegpu"; }
  std::span<const char* const> host_fallback_ops() const override { return ops::generic_host_fallback_ops(); }
};

models::ModelSpec fixture_spec(const std::string& family) {
  const io::Checkpoint ckpt = models::open_checkpoint(spool::testing::data_dir() + "/models/" + family);
  return models::build_spec(ckpt);
}

TEST(Loader, HostFallbackLineNamesTheOpsTheModelLeavesOnTheHost) {
  const FallbackBackend gpu;
  std::vector<std::string> ops;
  EXPECT_EQ(host_fallback_line(gpu, fixture_spec("gpt_oss"), &ops), "fakegpu: host fallback for attention_sinks (gpt_oss)");
  EXPECT_EQ(ops, std::vector<std::string>{"attention_sinks"});
  EXPECT_EQ(host_fallback_line(gpu, fixture_spec("deepseek_v3")), "fakegpu: host fallback for mla_attention, route_grouped_top_k (deepseek_v3)");
  EXPECT_EQ(host_fallback_line(gpu, fixture_spec("qwen3_moe"), &ops), "fakegpu: every op of qwen3_moe runs on the device");
  EXPECT_TRUE(ops.empty());
  // A backend running everything natively: no fallback for any model.
  const ops::CpuBackend cpu(nullptr);
  EXPECT_EQ(host_fallback_line(cpu, fixture_spec("deepseek_v3"), &ops), "cpu: every op of deepseek_v3 runs on the device");
  EXPECT_TRUE(ops.empty());
}

}  // namespace
}  // namespace spool::engine
