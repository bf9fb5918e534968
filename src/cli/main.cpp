// spool: run Mixture-of-Experts language models larger than memory.
// Exit codes: 0 success, 1 error (message on stderr), 2 usage error.
#include <pthread.h>
#include <signal.h>

#include <malloc.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/common.h"
#include "common/error.h"
#include "dist/comm.h"
#include "ops/cpu_targets.h"

int main(int argc, char** argv) {
  // A fixed mmap threshold (glibc's default value; setting it turns the dynamic threshold off):
  // every block of 128 KiB or more (KV caches, kernel scratch, tensor tables' arrays) is its
  // own mapping and goes back to the OS when freed. With the dynamic threshold a freed large
  // block raises the threshold and later ones land in the heap, where their pages stay
  // resident after free: the old KV buffers of a growth would stay in the peak RSS that
  // `spool plan` counts as a transient.
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  CLI::App app{"spool: run Mixture-of-Experts language models larger than memory"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "spool 0.1.0");
  spool::cli::register_generate(app);
  spool::cli::register_perplexity(app);
  spool::cli::register_tokenize(app);
  spool::cli::register_info(app);
  spool::cli::register_synth(app);
  spool::cli::register_calibrate(app);
  spool::cli::register_repack(app);
  spool::cli::register_plan(app);
  spool::cli::register_doctor(app);
  spool::cli::register_bench(app);
  spool::cli::register_convert(app);
  spool::cli::register_serve(app);
  spool::cli::register_template(app);
  // llama-server's `-np N` for --parallel (CLI11 takes one-letter short names only): the exact
  // argument "-np" after `serve` or `plan` is read as --parallel.
  std::vector<char*> args(argv, argv + argc);
  static char kParallel[] = "--parallel";
  if (argc > 1 && (std::string(argv[1]) == "serve" || std::string(argv[1]) == "plan"))
    for (int i = 2; i < argc; ++i)
      if (std::string(argv[i]) == "-np") args[static_cast<size_t>(i)] = kParallel;
  try {
    // Under mpirun (expert parallelism, docs/distributed.md) every rank runs this command in
    // lockstep; rank 0 alone writes the output.
    // serve takes SIGINT / SIGTERM on one thread (sigwait): blocked here, before MPI starts its
    // own threads under mpirun, so that none of those takes one (and ends the process).
    if (argc > 1 && std::string(argv[1]) == "serve") {
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, SIGINT);
      sigaddset(&set, SIGTERM);
      pthread_sigmask(SIG_BLOCK, &set, nullptr);
    }
    if (spool::dist::launched_by_mpi() && spool::dist::world().rank() > 0 && std::freopen("/dev/null", "w", stdout) == nullptr)
      throw spool::Error("cannot silence the standard output of an MPI rank");
    spool::ops::restrict_cpu_targets_from_env();  // SPOOL_HWY_TARGETS (ops/cpu_targets.h)
    app.parse(argc, args.data());
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  } catch (const spool::UsageError& e) {
    std::fprintf(stderr, "spool: usage error: %s\n", e.what());
    return 2;
  } catch (const spool::Error& e) {
    std::fprintf(stderr, "spool: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "spool: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "spool: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
