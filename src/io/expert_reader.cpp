#include "io/expert_reader.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/log.h"

namespace spool::io {

uint64_t ReadRequest::length() const {
  uint64_t n = 0;
  for (const auto& v : iov) n += v.iov_len;
  return n;
}

ExpertReader::ExpertReader(std::vector<std::string> shard_paths, Options opt) : opt_(opt) {
  if (opt_.workers < 1 || opt_.workers > 256) fail("--prefetch-workers must be between 1 and 256 (got %d)", opt_.workers);
  direct_all_ = opt_.direct;
  try {
    open_files(shard_paths);
    if (opt_.engine == IoEngine::kUring) {  // probe once so a missing io_uring is a clear error now
      io_uring ring;
      const int rc = io_uring_queue_init(8, &ring, 0);
      if (rc < 0) fail("io_uring is not available (%s); use --io-engine pread", std::strerror(-rc));
      io_uring_queue_exit(&ring);
    }
  } catch (...) {
    for (auto& f : files_)
      if (f.fd >= 0) ::close(f.fd);
    throw;
  }
  for (int i = 0; i < opt_.workers; ++i) threads_.emplace_back([this, i] { worker(i); });
}

void ExpertReader::open_files(const std::vector<std::string>& shard_paths) {
  for (const auto& p : shard_paths) {
    files_.push_back(File{p});
    File& f = files_.back();
    if (opt_.direct) {
      f.fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
      if (f.fd >= 0) {
        f.direct = true;
      } else if (errno == EINVAL) {
        f.fadvise = true;  // e.g. tmpfs: no O_DIRECT; drop pages after each read instead
        direct_all_ = false;
      } else {
        fail("%s: cannot open for reading (%s)", p.c_str(), std::strerror(errno));
      }
    }
    if (f.fd < 0) {
      f.fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
      if (f.fd < 0) fail("%s: cannot open for reading (%s)", p.c_str(), std::strerror(errno));
    }
    struct stat st;
    if (fstat(f.fd, &st) != 0) fail("%s: cannot stat (%s)", p.c_str(), std::strerror(errno));
    f.size = static_cast<uint64_t>(st.st_size);
  }
  if (opt_.direct && !direct_all_) log_warn("O_DIRECT is not supported for some model files; using buffered reads + posix_fadvise(DONTNEED)");
}

ExpertReader::~ExpertReader() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  for (auto& f : files_)
    if (f.fd >= 0) ::close(f.fd);
}

void ExpertReader::run_pread(const ReadRequest& r) {
  const File& f = files_.at(r.shard);
  std::vector<iovec> iov = r.iov;
  uint64_t off = r.offset, left = r.length();
  size_t first = 0;
  while (left > 0) {
    ssize_t n = ::preadv(f.fd, iov.data() + first, static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX)),
                         static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("%s: read of %llu bytes at offset %llu failed (%s)", f.path.c_str(), (unsigned long long)left,
           (unsigned long long)off, std::strerror(errno));
    }
    if (n == 0 && opt_.direct && off >= f.size) {
      // A read widened to 4096 bytes for O_DIRECT runs past the end of the file: the tail is
      // padding nobody uses; zero it. (Also when this file fell back to buffered reads: the
      // store widened the request all the same. Tensor ranges were checked against the file
      // size at open, so only padding can lie past the end.)
      for (size_t i = first; i < iov.size(); ++i) std::memset(iov[i].iov_base, 0, iov[i].iov_len);
      break;
    }
    if (n == 0)
      fail("%s: short read at offset %llu (%llu bytes missing; file truncated?)", f.path.c_str(), (unsigned long long)off,
           (unsigned long long)left);
    off += static_cast<uint64_t>(n);
    left -= static_cast<uint64_t>(n);
    uint64_t adv = static_cast<uint64_t>(n);
    while (adv > 0 && first < iov.size()) {  // advance past the bytes read
      if (adv >= iov[first].iov_len) {
        adv -= iov[first].iov_len;
        ++first;
      } else {
        iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + adv;
        iov[first].iov_len -= adv;
        adv = 0;
      }
    }
  }
  if (f.fadvise) posix_fadvise(f.fd, static_cast<off_t>(r.offset), static_cast<off_t>(r.length()), POSIX_FADV_DONTNEED);
  bytes_read_ += r.length();
  ++reads_;
}

void ExpertReader::run_uring(std::vector<ReadRequest>& reqs, void* ring_ptr) {
  io_uring* ring = static_cast<io_uring*>(ring_ptr);
  const unsigned depth = ring->sq.ring_entries;
  size_t next = 0, inflight = 0;
  std::vector<size_t> redo;  // short completions finished with preadv
  std::exception_ptr err;
  while (next < reqs.size() || inflight > 0) {
    while (next < reqs.size() && inflight < depth) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      if (sqe == nullptr) break;
      ReadRequest& r = reqs[next];
      io_uring_prep_readv(sqe, files_.at(r.shard).fd, r.iov.data(), static_cast<unsigned>(r.iov.size()), r.offset);
      io_uring_sqe_set_data64(sqe, next);
      ++next;
      ++inflight;
    }
    int rc = io_uring_submit_and_wait(ring, 1);
    if (rc < 0 && rc != -EINTR) {
      // Nothing new was queued; wait out what is in flight so no buffer is written after
      // we report the failure (the caller recycles them), then fail.
      while (inflight > 0) {
        io_uring_cqe* c;
        if (io_uring_wait_cqe(ring, &c) != 0) break;
        io_uring_cqe_seen(ring, c);
        --inflight;
      }
      fail("io_uring submit failed (%s)", std::strerror(-rc));
    }
    io_uring_cqe* cqe;
    while (io_uring_peek_cqe(ring, &cqe) == 0) {
      const size_t i = io_uring_cqe_get_data64(cqe);
      const int res = cqe->res;
      io_uring_cqe_seen(ring, cqe);
      --inflight;
      const ReadRequest& r = reqs[i];
      if (res < 0 && !err) {
        try {
          fail("%s: read of %llu bytes at offset %llu failed (%s)", files_.at(r.shard).path.c_str(),
               (unsigned long long)r.length(), (unsigned long long)r.offset, std::strerror(-res));
        } catch (...) {
          err = std::current_exception();
        }
      } else if (res >= 0 && static_cast<uint64_t>(res) < r.length()) {
        redo.push_back(i);  // short read: finish synchronously (handles EOF as an error)
      } else if (res >= 0) {
        if (files_.at(r.shard).fadvise)
          posix_fadvise(files_.at(r.shard).fd, static_cast<off_t>(r.offset), static_cast<off_t>(r.length()), POSIX_FADV_DONTNEED);
        bytes_read_ += r.length();
        ++reads_;
      }
    }
  }
  if (err) std::rethrow_exception(err);
  for (size_t i : redo) run_pread(reqs[i]);
}

void ExpertReader::finish(const BatchPtr& b, int64_t n, std::exception_ptr err) {
  std::function<void(std::exception_ptr)> cb;
  std::exception_ptr final_err;
  {
    std::lock_guard<std::mutex> lk(b->mu_);
    if (err && !b->error_) b->error_ = err;
    b->pending_ -= n;
    if (b->pending_ != 0) return;
    cb = std::move(b->on_done_);
    final_err = b->error_;
  }
  // The callback runs before the batch reports done, so a waiter sees its effects.
  if (cb) cb(final_err);
  {
    std::lock_guard<std::mutex> lk(b->mu_);
    b->remaining_.store(0, std::memory_order_release);
  }
  b->cv_.notify_all();
}

void ExpertReader::worker(int) {
  io_uring ring;
  bool have_ring = false;
  if (opt_.engine == IoEngine::kUring) {
    have_ring = io_uring_queue_init(64, &ring, 0) == 0;
    if (!have_ring) log_warn("an io_uring ring could not be set up for an I/O worker; it uses pread instead");
  }
  for (;;) {
    Task t;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) break;
      t = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr err;
    try {
      if (have_ring) {
        run_uring(t.reqs, &ring);
      } else {
        for (const auto& r : t.reqs) run_pread(r);
      }
    } catch (...) {
      err = std::current_exception();
    }
    finish(t.batch, static_cast<int64_t>(t.reqs.size()), err);
  }
  if (have_ring) io_uring_queue_exit(&ring);
}

ExpertReader::BatchPtr ExpertReader::submit(std::vector<ReadRequest> reqs, std::function<void(std::exception_ptr)> on_done) {
  auto b = std::make_shared<Batch>();
  b->on_done_ = std::move(on_done);
  if (reqs.empty()) {
    if (b->on_done_) b->on_done_(nullptr);
    return b;
  }
  b->remaining_.store(1);
  b->pending_ = static_cast<int64_t>(reqs.size());
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (opt_.engine == IoEngine::kUring) {
      // Split the batch across rings so large batches still use several queues.
      const size_t parts = std::min<size_t>(reqs.size(), static_cast<size_t>(opt_.workers));
      const size_t per = (reqs.size() + parts - 1) / parts;
      for (size_t i = 0; i < reqs.size(); i += per) {
        Task t{b, {}};
        for (size_t j = i; j < std::min(reqs.size(), i + per); ++j) t.reqs.push_back(std::move(reqs[j]));
        queue_.push_back(std::move(t));
      }
    } else {
      for (auto& r : reqs) queue_.push_back(Task{b, {std::move(r)}});
    }
  }
  cv_.notify_all();
  return b;
}

void ExpertReader::wait(const BatchPtr& b) {
  std::unique_lock<std::mutex> lk(b->mu_);
  b->cv_.wait(lk, [&] { return b->remaining_.load(std::memory_order_acquire) == 0; });
  if (b->error_) std::rethrow_exception(b->error_);
}

void ExpertReader::read_all(std::vector<ReadRequest> reqs) { wait(submit(std::move(reqs))); }

}  // namespace spool::io
