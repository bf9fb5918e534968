#include "cli/doctor_checks.h"

#include <hwy/targets.h>

#include <algorithm>
#include <filesystem>

#include "common/error.h"
#include "common/sysinfo.h"
#include "cli/probe.h"
#include "plan/projection.h"
#include "cli/plan_source.h"

namespace spool::plan {

namespace fs = std::filesystem;

const char* check_status_name(CheckStatus s) { return s == CheckStatus::kOk ? "ok" : s == CheckStatus::kWarn ? "warn" : "fail"; }

namespace {

Check simd_check() {
  Check c{"simd", CheckStatus::kOk, "", ""};
  const int64_t supported = hwy::SupportedTargets();
  std::string list;
  for (int64_t bit = 1; bit != 0 && bit <= supported; bit <<= 1)
    if ((supported & bit) && (bit & HWY_TARGETS)) list += std::string(list.empty() ? "" : " ") + hwy::TargetName(bit);
  const int64_t usable = supported & HWY_TARGETS;
  const int64_t best = usable & -usable;
  c.detail = strfmt("Highway targets compiled in and supported by this CPU: %s; kernels use %s", list.c_str(), hwy::TargetName(best));
  if (best & (HWY_SCALAR | HWY_EMU128)) {
    c.status = CheckStatus::kFail;
    c.fix = "no SIMD target: run on an x86-64 CPU with AVX2 (or ARM with NEON/SVE), or rebuild without SPOOL_HWY_STATIC_ONLY";
  } else if (best & (HWY_SSSE3 | HWY_SSE4)) {
    c.status = CheckStatus::kWarn;
    c.fix = "only SSE-class SIMD: matmuls run ~2x slower than with AVX2; use a CPU with AVX2/AVX-512 if you can";
  }
  return c;
}

Check memory_check(uint64_t model_peak, const char* verdict) {
  Check c{"memory", CheckStatus::kOk, "", ""};
  const uint64_t avail = available_memory_bytes(), total = total_memory_bytes(), cg = cgroup_memory_limit_bytes();
  c.detail = strfmt("%s available of %s", format_bytes(avail).c_str(), format_bytes(total).c_str());
  if (cg) c.detail += strfmt(" (cgroup limit %s)", format_bytes(cg).c_str());
  if (model_peak) c.detail += strfmt("; the model's planned peak is %s (%s)", format_bytes(model_peak).c_str(), verdict);
  if (std::string(verdict) == "no_fit") {
    c.status = CheckStatus::kFail;
    c.fix = "the model does not fit even streaming: free memory, raise the cgroup limit, or use a smaller quantization (spool convert)";
  } else if (std::string(verdict) == "stream") {
    c.status = CheckStatus::kWarn;
    c.fix = "experts will stream from disk (slower); more memory or a smaller quantization keeps them resident";
  } else if (avail < (2ull << 30)) {
    c.status = CheckStatus::kWarn;
    c.fix = "less than 2 GiB available: close other programs or raise the cgroup memory limit";
  }
  return c;
}

}  // namespace

std::vector<Check> run_doctor(const std::string& model_dir, int threads) {
  std::vector<Check> out;
  uint64_t peak = 0;
  std::string verdict = "-";
  std::string biggest_shard;
  if (!model_dir.empty()) {
    Check m{"model", CheckStatus::kOk, "", ""};
    try {
      ModelSource src = open_source(model_dir);
      PlanInputs in;
      in.shape.threads = threads;
      in.shape.tokenizer_json_bytes = src.tokenizer_json_bytes;
      in.available = available_memory_bytes();
      in.model_arg = model_dir;
      const Projection p = project(src.ckpt, in);
      peak = p.peak;
      verdict = verdict_name(p.verdict);
      m.detail = strfmt("%s: %s, %d layers, %s in %zu shard(s)", model_dir.c_str(), p.spec.model_type.c_str(), p.spec.n_layers,
                        format_bytes(p.weights.file_bytes).c_str(), src.ckpt.shards().size());
      uint64_t best = 0;
      for (const auto& s : src.ckpt.shards())
        if (s.file_size() > best) best = s.file_size(), biggest_shard = s.path();
      out.push_back(m);
      Check t{"tokenizer", CheckStatus::kOk, "tokenizer.json present", ""};
      if (!src.tokenizer_json_bytes) {
        t.status = CheckStatus::kWarn;
        t.detail = "no tokenizer.json: only --prompt-ids works";
        t.fix = "copy tokenizer.json (and tokenizer_config.json) from the original model into " + model_dir;
      }
      out.push_back(t);
    } catch (const std::exception& e) {
      m.status = CheckStatus::kFail;
      m.detail = e.what();
      m.fix = "point --model at a Hugging Face checkpoint directory (config.json + *.safetensors) of a supported model_type";
      out.push_back(m);
    }
  }
  out.push_back(simd_check());
  out.push_back(memory_check(peak, verdict.c_str()));

  Check d{"disk", CheckStatus::kOk, "", ""};
  if (biggest_shard.empty()) {
    d.status = CheckStatus::kWarn;
    d.detail = "not measured (no model shard to read)";
    d.fix = "run spool doctor --model DIR to measure direct-read bandwidth on the model's disk";
  } else {
    const DiskProbe p = measure_disk_gbps(biggest_shard, 256ull << 20, 4ull << 20, 4, 1.0);
    if (!p.ok) {
      d.status = CheckStatus::kFail;
      d.detail = p.error;
      d.fix = "check the file is readable and the disk healthy";
    } else {
      d.detail = strfmt("%.2f GB/s %s reads (%s of %s, 4 MiB blocks, 4 in flight)", p.gbps, p.direct ? "O_DIRECT" : "buffered",
                        format_bytes(p.bytes).c_str(), biggest_shard.c_str());
      if (p.gbps < 0.5) {
        d.status = CheckStatus::kWarn;
        d.fix = "slow disk for streaming experts: put the model on NVMe, or keep experts resident (more memory / smaller quantization)";
      }
    }
  }
  out.push_back(d);

  const std::string dir = model_dir.empty() ? fs::current_path().string() : model_dir;
  Check o{"o_direct", CheckStatus::kOk, "", ""};
  std::string why;
  if (direct_io_supported(dir, &why)) {
    o.detail = "O_DIRECT reads work in " + dir;
  } else {
    o.status = CheckStatus::kWarn;
    o.detail = why;
    o.fix = "streaming falls back to buffered reads + fadvise(DONTNEED); move the model to ext4/xfs for O_DIRECT";
  }
  out.push_back(o);

  Check u{"io_uring", CheckStatus::kOk, "io_uring rings can be created (--io-engine uring available)", ""};
  if (!io_uring_supported(&why)) {
    u.status = CheckStatus::kWarn;
    u.detail = "io_uring unavailable: " + why;
    u.fix = "use --io-engine pread (the default), or allow io_uring (kernel >= 5.6, sysctl kernel.io_uring_disabled=0, seccomp)";
  }
  out.push_back(u);
  return out;
}

}  // namespace spool::plan
