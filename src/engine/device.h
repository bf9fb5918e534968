// The device side of loading: which GPUs this build and machine have, --device resolution, the
// backend a run gets, and the GPU facts placement needs. Every `#if SPOOL_HAVE_CUDA` of the engine
// lives in device.cpp, so engine::load() reads the same with and without CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "models/spec.h"
#include "ops/backend.h"

namespace spool::engine {

/// Whether this build has the CUDA backend (cmake -DSPOOL_CUDA=ON).
bool has_cuda_backend();
/// Whether this build has the CUDA backend and, if so, how many GPUs the runtime sees.
int cuda_devices();
/// Measured host-to-device bandwidth of GPU `index` in GB/s (pinned or pageable host memory,
/// `bytes` per copy); 0 in a build without CUDA.
double h2d_gbps(int index, size_t bytes, bool pinned);
/// Name, memory (bytes) and compute capability of GPU `index`; empty / 0 in a build without
/// CUDA or for a device the runtime does not see.
struct GpuInfo {
  std::string name;
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;  // free now (cudaMemGetInfo)
  int major = 0, minor = 0;
};
GpuInfo gpu_info(int index);
/// Resolves --device (cpu | cuda | cuda:N | auto) to a GPU index, or -1 for the CPU: auto is
/// cuda:0 when this build has CUDA and a GPU is present. Under an MPI launcher with several ranks
/// (dist::launched_by_mpi), auto and cuda take GPU (local rank mod the GPUs seen) instead of 0:
/// one GPU per rank of a host. Throws spool::UsageError for another
/// value or for cuda[:N] in a build without CUDA, spool::Error when the GPU is not there.
int resolve_device(const std::string& device);

/// A GPU backend made for a run.
struct GpuBackend {
  std::shared_ptr<ops::Backend> backend;  // ops::CudaBackend on the GPU
  std::string device;                     // "cuda:N"
  std::string name;                       // the GPU's name
  uint64_t vram_budget = 0;               // bytes: `vram_budget` as given, or plan::auto_vram_budget of the card
};
/// The backend of GPU `index` (>= 0, from resolve_device) with its VRAM budget: `vram_budget`
/// bytes (--vram-budget-gb), or nullopt for auto. Throws spool::Error in a build without CUDA.
GpuBackend make_gpu_backend(int index, std::optional<uint64_t> vram_budget);

/// The NCCL communicator over `host`'s ranks on GPU backend `be`: its device, its compute stream
/// (dist::nccl_comm; collectives queued in order with the backend's ops). Every rank must call
/// it. Throws spool::Error for a host backend, or in a build without CUDA or NCCL.
std::unique_ptr<dist::Comm> make_device_comm(ops::Backend& be, dist::Comm& host);

/// Bytes a device backend has uploaded so far (dense weights and parameters at bind, experts
/// once placed); 0 for a host backend.
uint64_t device_uploaded_bytes(const ops::Backend& be);

/// The loader's line on a device backend: the ops a model of `spec` calls
/// (models::optional_ops_used) that `be` runs through the host (ops::Backend::host_fallback_ops),
/// e.g. "cuda: host fallback for attention_sinks (gpt_oss)", or "cuda: every op of qwen3_moe runs
/// on the device" when there are none. Empty `fallbacks_out` is filled with those ops when given.
std::string host_fallback_line(const ops::Backend& be, const models::ModelSpec& spec, std::vector<std::string>* fallbacks_out = nullptr);

}  // namespace spool::engine
