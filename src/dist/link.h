// The links between the ranks as expert parallelism uses them (docs/distributed.md): what one
// MoE layer's exchange costs with a few rows (latency) and with many (bandwidth), measured with
// the communicator's own collective, for `spool doctor` under mpirun and `spool plan --ranks`.
#pragma once

#include <cstddef>

#include "dist/comm.h"

namespace spool::dist {

/// One measurement of the links (every rank gets rank 0's numbers).
struct LinkMeasure {
  int ranks = 1;
  double latency_us = 0;  ///< median wall time of one allgather_rows_in_place of one row of 4 floats per rank
  double gbps = 0;        ///< GB/s (1e9 bytes) one rank receives from the others in an exchange of `bytes_per_rank` each
};

/// Measures the links of `c`: `reps` small exchanges (after a few unmeasured ones) and large ones
/// of `bytes_per_rank` bytes from every rank (less when R ranks' would pass 256 MiB), all with Comm::allgather_rows_in_place (the MoE
/// layer's collective). A collective: every rank must call it with the same arguments. With one
/// rank there is nothing to measure: {1, 0, 0}. Throws spool::Error for reps < 1 or a zero size.
LinkMeasure measure_link(Comm& c, int reps = 200, size_t bytes_per_rank = size_t{8} << 20);

}  // namespace spool::dist
