#include "io/page_cache_warmer.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "common/error.h"
#include "common/log.h"
#include "common/sysinfo.h"

namespace spool::io {

namespace {

// The calling thread at the lowest CPU priority (SCHED_IDLE, else nice 19) and in the idle I/O
// class (its reads are served when the disk has nothing else to do, on schedulers that honour
// I/O priorities: BFQ, mq-deadline). Refusals are ignored: the warmer then runs at normal priority.
void lowest_priority() {
  sched_param sp{};
  if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp) != 0) setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
  constexpr int kWhoProcess = 1, kClassIdle = 3, kClassShift = 13;  // linux/ioprio.h
  syscall(SYS_ioprio_set, kWhoProcess, static_cast<int>(syscall(SYS_gettid)), kClassIdle << kClassShift);
}

}  // namespace

PageCacheWarmer::PageCacheWarmer(std::vector<std::string> paths, bool log) : paths_(std::move(paths)), log_(log) {
  t0_ = now_seconds();
  thread_ = std::thread([this] { run(); });
}

PageCacheWarmer::~PageCacheWarmer() { stop(); }

void PageCacheWarmer::stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void PageCacheWarmer::wait() {
  if (thread_.joinable()) thread_.join();
}

WarmResult PageCacheWarmer::result() const {
  std::lock_guard<std::mutex> lk(mu_);
  WarmResult r = res_;
  if (!r.done) r.seconds = now_seconds() - t0_;
  return r;
}

void PageCacheWarmer::run() {
  lowest_priority();
  const long page = sysconf(_SC_PAGESIZE);
  std::unique_ptr<uint8_t[]> buf(new uint8_t[kChunk]);
  std::vector<unsigned char> vec;
  std::string error;
  struct stat st{};
  {
    uint64_t total = 0;
    for (const std::string& p : paths_)
      if (::stat(p.c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_size);
    std::lock_guard<std::mutex> lk(mu_);
    res_.bytes_total = total;
  }
  const uint64_t pg = static_cast<uint64_t>(page);
  for (const std::string& p : paths_) {
    if (stop_.load() || !error.empty()) break;
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      error = strfmt("%s: cannot open (%s)", p.c_str(), std::strerror(errno));
      break;
    }
    const uint64_t size = ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    // Which pages are resident before this file is read (mincore over a mapping that is never
    // touched): chunks all resident then are skipped, the others read (the kernel's readahead
    // of one chunk makes the next resident, so asking chunk by chunk would count that as found).
    vec.assign((size + pg - 1) / pg, 0);
    if (size > 0) {
      void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      if (map != MAP_FAILED) {
        if (mincore(map, size, vec.data()) != 0) std::fill(vec.begin(), vec.end(), 0);
        ::munmap(map, size);
      }
    }
    for (uint64_t off = 0; off < size && !stop_.load(); off += kChunk) {
      const uint64_t n = std::min(kChunk, size - off);
      bool resident = true;
      for (uint64_t i = off / pg; i < (off + n + pg - 1) / pg && resident; ++i) resident = (vec[i] & 1) != 0;
      if (!resident) {
        uint64_t got = 0;
        while (got < n) {
          const ssize_t r = ::pread(fd, buf.get(), n - got, static_cast<off_t>(off + got));
          if (r < 0 && errno == EINTR) continue;
          if (r <= 0) {
            error = strfmt("%s: read failed at byte %llu (%s)", p.c_str(), (unsigned long long)(off + got),
                           r < 0 ? std::strerror(errno) : "unexpected end of file");
            break;
          }
          got += static_cast<uint64_t>(r);
        }
        if (!error.empty()) break;
      }
      std::lock_guard<std::mutex> lk(mu_);
      (resident ? res_.bytes_resident : res_.bytes_read) += n;
    }
    ::close(fd);
  }
  WarmResult r;
  {
    std::lock_guard<std::mutex> lk(mu_);
    res_.done = true;
    res_.stopped = stop_.load() && error.empty() && res_.bytes_read + res_.bytes_resident < res_.bytes_total;
    res_.error = error;
    res_.seconds = now_seconds() - t0_;
    r = res_;
  }
  if (!log_) return;
  if (!r.error.empty())
    log_warn("--warm-page-cache: %s; warming ended after %s", r.error.c_str(), format_bytes(r.bytes_read).c_str());
  else
    log_info("--warm-page-cache: %s %s of the model's %s into the page cache in %.2f s (%s were already there)",
             r.stopped ? "stopped after reading" : "read", format_bytes(r.bytes_read).c_str(), format_bytes(r.bytes_total).c_str(),
             r.seconds, format_bytes(r.bytes_resident).c_str());
}

}  // namespace spool::io
