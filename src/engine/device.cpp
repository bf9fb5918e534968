#include "engine/device.h"

#include <algorithm>
#include <cstdlib>

#include "common/error.h"
#include "dist/nccl_comm.h"
#include "models/ops_used.h"
#include "plan/gpu.h"
#if SPOOL_HAVE_CUDA
#include "ops/cuda/cuda_backend.h"
#endif

namespace spool::engine {

bool has_cuda_backend() {
#if SPOOL_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_devices() {
#if SPOOL_HAVE_CUDA
  return ops::cuda_device_count();
#else
  return 0;
#endif
}

double h2d_gbps(int index, size_t bytes, bool pinned) {
#if SPOOL_HAVE_CUDA
  return ops::cuda_h2d_gbps(index, bytes, pinned);
#else
  (void)index, (void)bytes, (void)pinned;
  return 0;
#endif
}

GpuInfo gpu_info(int index) {
  GpuInfo g;
#if SPOOL_HAVE_CUDA
  if (index >= 0 && index < cuda_devices()) {
    const ops::CudaDeviceInfo d = ops::cuda_device_info(index);
    g.name = d.name;
    g.total_bytes = d.total_bytes;
    g.free_bytes = d.free_bytes;
    g.major = d.major;
    g.minor = d.minor;
  }
#else
  (void)index;
#endif
  return g;
}

namespace {
// This process's rank among the launcher's ranks on this host (Open MPI, MPICH / Hydra, PMIx); 0
// outside a launcher with several ranks.
int local_rank() {
  if (!dist::launched_by_mpi()) return 0;
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMIX_LOCAL_RANK"})
    if (const char* v = std::getenv(name)) return std::max(0, std::atoi(v));
  return 0;
}
}  // namespace

int resolve_device(const std::string& device) {
  // (GGUF block weights: CPU only, decided once the checkpoint is open.) Under mpirun, "auto" and
  // "cuda" give each rank of a host its own GPU: local rank mod the GPUs seen.
  if (device == "auto") return cuda_devices() > 0 ? local_rank() % cuda_devices() : -1;
  if (device == "cpu") return -1;
  if (device != "cuda" && device.rfind("cuda:", 0) != 0)
    throw UsageError(strfmt("--device must be cpu, cuda, cuda:N or auto (got '%s')", device.c_str()));
  int index = 0;
  if (device != "cuda") {
    char* end = nullptr;
    const long v = std::strtol(device.c_str() + 5, &end, 10);
    if (end == device.c_str() + 5 || *end != '\0' || v < 0 || v > 1024)
      throw UsageError(strfmt("--device must be cpu, cuda, cuda:N or auto (got '%s')", device.c_str()));
    index = static_cast<int>(v);
  }
  if (!has_cuda_backend())
    throw UsageError(strfmt("--device %s: this build has no CUDA backend (configure with -DSPOOL_CUDA=ON)", device.c_str()));
  if (device == "cuda" && cuda_devices() > 0) index = local_rank() % cuda_devices();
  if (index >= cuda_devices()) fail("--device %s: no such GPU (the CUDA runtime sees %d)", device.c_str(), cuda_devices());
  return index;
}

GpuBackend make_gpu_backend(int index, std::optional<uint64_t> vram_budget) {
  GpuBackend g;
#if SPOOL_HAVE_CUDA
  g.backend = std::make_shared<ops::CudaBackend>(index);
  const ops::CudaDeviceInfo info = ops::cuda_device_info(index);
  g.device = strfmt("cuda:%d", index);
  g.name = info.name;
  g.vram_budget = vram_budget.value_or(plan::auto_vram_budget(info.total_bytes, info.free_bytes));
#else
  (void)vram_budget;
  fail("cuda:%d: this build has no CUDA backend (configure with -DSPOOL_CUDA=ON)", index);
#endif
  return g;
}

std::unique_ptr<dist::Comm> make_device_comm(ops::Backend& be, dist::Comm& host) {
#if SPOOL_HAVE_CUDA
  if (auto* cuda = dynamic_cast<ops::CudaBackend*>(&be)) return dist::nccl_comm(host, cuda->device_index(), cuda->stream_handle());
#endif
  fail("--comm nccl: the %s backend runs on the host; the NCCL communicator moves GPU memory (--device cuda)", be.name());
}

uint64_t device_uploaded_bytes(const ops::Backend& be) {
#if SPOOL_HAVE_CUDA
  if (const auto* cuda = dynamic_cast<const ops::CudaBackend*>(&be)) return cuda->uploaded_bytes();
#else
  (void)be;
#endif
  return 0;
}

std::string host_fallback_line(const ops::Backend& be, const models::ModelSpec& spec, std::vector<std::string>* fallbacks_out) {
  std::vector<std::string> fallbacks;
  for (const std::string& op : models::optional_ops_used(spec))
    if (be.op_run(op) == ops::OpRun::kHostFallback) fallbacks.push_back(op);
  std::sort(fallbacks.begin(), fallbacks.end());
  const std::string name = spec.family.empty() ? spec.model_type : spec.family;
  std::string line;
  if (fallbacks.empty()) {
    line = strfmt("%s: every op of %s runs on the device", be.name(), name.c_str());
  } else {
    line = strfmt("%s: host fallback for ", be.name());
    for (size_t i = 0; i < fallbacks.size(); ++i) line += (i ? ", " : "") + fallbacks[i];
    line += " (" + name + ")";
  }
  if (fallbacks_out) *fallbacks_out = std::move(fallbacks);
  return line;
}

}  // namespace spool::engine
