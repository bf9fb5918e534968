// libFuzzer target for llama.cpp GGUF LoRA adapter files (lora/gguf_adapter.cpp): arbitrary bytes
// as a .gguf adapter over the qwen3_moe fixture checkpoint. Errors must be spool::Error, never a
// crash, a hang or an out-of-bounds read; an adapter that loads must bind (LoraSet::dense /
// experts at the shapes it claims, or fail with spool::Error) with finite bookkeeping.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/error.h"
#include "io/checkpoint.h"
#include "lora/adapter.h"
#include "lora/lora_set.h"
#include "models/family.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace spool;
  static const std::shared_ptr<io::Checkpoint> base =
      std::make_shared<io::Checkpoint>(models::open_checkpoint(std::string(SPOOL_TEST_DATA_DIR) + "/models/qwen3_moe"));
  const std::string path = "/tmp/spool_lora_adapter_fuzz_" + std::to_string(getpid()) + ".gguf";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    lora::Adapter ad = lora::load_gguf_adapter(path, *base, models::checkpoint_rules());
    if (ad.run_bytes() < ad.bytes()) std::abort();
    lora::LoraSet set;
    set.add(std::move(ad), 1.0f);
    const lora::Adapter& a = set.adapters().front();
    for (const lora::DenseLora& d : a.dense)
      if (set.dense(d.name, d.out, d.in) == nullptr) std::abort();
    const int64_t hidden = base->config().get_int("hidden_size"), inter = base->config().get_int("moe_intermediate_size");
    for (const lora::ExpertLora& e : a.experts) (void)set.experts(e.name, 8, hidden, inter);
  } catch (const Error&) {
  }
  return 0;
}
