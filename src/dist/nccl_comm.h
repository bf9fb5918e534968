// The NCCL communicator (docs/distributed.md#gpus-nccl): dist::Comm's collectives on device
// memory, queued on a CUDA stream the caller gives (the backend's compute stream, so collectives
// are ordered with the kernels around them without an extra sync). Built when SPOOL_CUDA is on
// and NCCL is found (SPOOL_HAVE_NCCL); a build without it has have_nccl() false and nccl_comm()
// throws.
#pragma once

#include <memory>

#include "dist/comm.h"

namespace spool::dist {

/// True when this build has the NCCL communicator.
bool have_nccl();

/// An NCCL communicator over the ranks of `host` (one rank per process, each on its own GPU):
/// same rank and size as `host`; rank 0's ncclUniqueId reaches the others through
/// host.broadcast (MPI's world under mpirun; with the one-rank self communicator it is a
/// one-rank NCCL communicator, ncclCommInitRank with nranks 1). `device` is the CUDA device
/// index; `stream` a cudaStream_t on that device that outlives every collective (pointers passed
/// to the collectives are device memory of that device, allgather_rows's `out` excepted: host).
/// Throws spool::Error naming the NCCL or CUDA call and its error string, or when this build has
/// no NCCL. Every rank must call it (a collective). Its CommStats::seconds are host time: queueing
/// the collectives plus the waits for the row counts (a gather's counts are read on the host, after
/// the stream's earlier work); the collectives' own GPU time overlaps and is not in it.
std::unique_ptr<Comm> nccl_comm(Comm& host, int device, void* stream);

}  // namespace spool::dist
