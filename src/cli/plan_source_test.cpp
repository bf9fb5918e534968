// Remote and local checkpoint reading for the planner: a small HTTP server in the test
// process serves a fixture directory with and without Range support; truncated headers,
// missing files and every local fixture model are checked.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "plan/footprint.h"
#include "plan/projection.h"
#include "cli/plan_source.h"
#include "models/family.h"

namespace spool::plan {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A one-request-at-a-time HTTP/1.1 server over a directory. With `ranges`, "Range: bytes=a-b"
// gets a 206 with Content-Range; without, every GET gets the whole file (200).
class FileServer {
 public:
  FileServer(std::string root, bool ranges) : root_(std::move(root)), ranges_(ranges) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::listen(fd_, 16);
    th_ = std::thread([this] { loop(); });
  }
  ~FileServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    th_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/"; }
  uint64_t body_bytes_sent() const { return sent_; }

 private:
  void loop() {
    while (!stop_) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      serve(c);
      ::close(c);
    }
  }
  void send_all(int c, const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::send(c, p, n, MSG_NOSIGNAL);
      if (w <= 0) return;  // the client hung up (it stops reading once it has the header)
      p += w;
      n -= static_cast<size_t>(w);
      sent_ += static_cast<uint64_t>(w);
    }
  }
  void serve(int c) {
    std::string req;
    char buf[4096];
    while (req.find("\r\n\r\n") == std::string::npos) {
      const ssize_t r = ::recv(c, buf, sizeof buf, 0);
      if (r <= 0) return;
      req.append(buf, static_cast<size_t>(r));
    }
    const size_t sp1 = req.find(' '), sp2 = req.find(' ', sp1 + 1);
    const std::string path = req.substr(sp1 + 2, sp2 - sp1 - 2);
    const std::string file = root_ + "/" + path;
    if (path.find("..") != std::string::npos || !fs::is_regular_file(file)) {
      const std::string r = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
      send_all(c, r.data(), r.size());
      return;
    }
    const std::string body = slurp(file);
    unsigned long long b = 0, e = 0;
    const size_t rp = req.find("Range: bytes=");
    if (ranges_ && rp != std::string::npos && std::sscanf(req.c_str() + rp + 13, "%llu-%llu", &b, &e) == 2 && b < body.size()) {
      e = std::min<unsigned long long>(e, body.size() - 1);
      const std::string h = "HTTP/1.1 206 Partial Content\r\nContent-Length: " + std::to_string(e - b + 1) + "\r\nContent-Range: bytes " +
                            std::to_string(b) + "-" + std::to_string(e) + "/" + std::to_string(body.size()) +
                            "\r\nConnection: close\r\n\r\n";
      send_all(c, h.data(), h.size());
      send_all(c, body.data() + b, e - b + 1);
      return;
    }
    const std::string h = "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
    send_all(c, h.data(), h.size());
    send_all(c, body.data(), body.size());
  }

  std::string root_;
  bool ranges_;
  int fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> sent_{0};
  std::thread th_;
};

const std::string kDemo = SPOOL_DEFAULT_MODEL_DIR;

void expect_same_checkpoint(const io::Checkpoint& a, const io::Checkpoint& b) {
  EXPECT_EQ(a.tensors().size(), b.tensors().size());
  EXPECT_EQ(a.total_bytes(), b.total_bytes());
  EXPECT_EQ(a.expert_bytes(), b.expert_bytes());
  EXPECT_EQ(a.file_bytes(), b.file_bytes());
  EXPECT_EQ(a.model_type(), b.model_type());
}

TEST(PlanSource, RangeServerReadsOnlyHeaders) {
  FileServer srv(kDemo, /*ranges=*/true);
  const ModelSource remote = open_source(srv.url());
  const ModelSource local = open_source(kDemo);
  EXPECT_TRUE(remote.remote);
  expect_same_checkpoint(remote.ckpt, local.ckpt);
  EXPECT_EQ(remote.tokenizer_json_bytes, local.tokenizer_json_bytes);
  // config + generation config + the 148 KB index + 4 headers of ~45 KB (1536 per-expert
  // tensors each) + 1 byte of tokenizer.json: a few hundred KB of a 38 MB model.
  EXPECT_LT(remote.bytes_fetched, 400u << 10);
  EXPECT_LT(srv.body_bytes_sent(), 400u << 10);
  // The projection is the same from either source.
  PlanInputs in;
  in.available = 8ull << 30;
  in.model_arg = "m";
  EXPECT_EQ(project(remote.ckpt, in).peak, project(local.ckpt, in).peak);
}

TEST(PlanSource, ServerWithoutRangeIsReadOnlyUpToTheHeaders) {
  FileServer srv(kDemo, /*ranges=*/false);
  const ModelSource remote = open_source(srv.url());
  expect_same_checkpoint(remote.ckpt, open_source(kDemo).ckpt);
  // The 4 shards are 38 MB; the transfer of each is aborted after its header.
  EXPECT_LT(remote.bytes_fetched, 2u << 20) << remote.bytes_fetched;
}

class TempDir {
 public:
  TempDir() {
    path_ = (fs::path(testing::TempDir()) / ("plan_src_" + std::to_string(::getpid()) + "_" +
                                              testing::UnitTest::GetInstance()->current_test_info()->name()))
                .string();
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void write_file(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

TEST(PlanSource, TruncatedHeaderIsAClearError) {
  TempDir d;
  fs::copy_file(kDemo + "/config.json", d.path() + "/config.json");
  write_file(d.path() + "/model.safetensors", le64(5000) + std::string(92, '{'));  // 100 bytes, header says 5000
  for (bool ranges : {true, false}) {
    FileServer srv(d.path(), ranges);
    try {
      open_source(srv.url());
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("truncated safetensors header"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
    }
  }
  write_file(d.path() + "/model.safetensors", "abc");  // shorter than the length field
  FileServer srv(d.path(), true);
  EXPECT_THROW(
      {
        try {
          open_source(srv.url());
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("shorter than the 8-byte header length"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
}

TEST(PlanSource, MissingFilesAreClearErrors) {
  TempDir d;
  FileServer srv(d.path(), true);
  try {
    open_source(srv.url());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json: not found (HTTP 404)"), std::string::npos) << e.what();
  }
  fs::copy_file(kDemo + "/config.json", d.path() + "/config.json");
  try {
    open_source(srv.url());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors: not found"), std::string::npos) << e.what();
  }
  write_file(d.path() + "/model.safetensors.index.json", R"({"weight_map": {"a": "../etc/passwd"}})");
  EXPECT_THROW(open_source(srv.url()), Error);
  EXPECT_THROW(open_source("/nonexistent/model/dir"), Error);
  EXPECT_THROW(open_source("http://127.0.0.1:1/"), Error);  // connection refused
}

TEST(PlanSource, NormalizesHuggingFaceUrls) {
  EXPECT_EQ(normalize_base_url("https://huggingface.co/Qwen/Qwen3.6-35B-A3B"), "https://huggingface.co/Qwen/Qwen3.6-35B-A3B/resolve/main/");
  EXPECT_EQ(normalize_base_url("https://huggingface.co/Qwen/X/resolve/main"), "https://huggingface.co/Qwen/X/resolve/main/");
  EXPECT_EQ(normalize_base_url("http://host:8/dir/"), "http://host:8/dir/");
  EXPECT_TRUE(is_url("https://a"));
  EXPECT_FALSE(is_url("/models/x"));
}

TEST(PlanSource, EveryLocalFixtureProjects) {
  int projected = 0;
  for (const char* name : {"qwen3_5_moe_text", "qwen3_5_moe_vl", "qwen3_5_moe_vl_fused", "qwen3_moe", "qwen3_next", "",
                           "deepseek_v3", "deepseek_v3_kimi", "deepseek_v2_lite", "mixtral", "olmoe", "ernie4_5_moe"}) {
    const std::string dir = *name ? std::string(SPOOL_TEST_DATA_DIR) + "/models/" + name : kDemo;
    SCOPED_TRACE(dir);
    const ModelSource src = open_source(dir);
    const io::Checkpoint mapped = models::open_checkpoint(dir);
    expect_same_checkpoint(src.ckpt, mapped);
    PlanInputs in;
    in.available = 64ull << 30;
    in.model_arg = dir;
    const Projection p = project(src.ckpt, in);
    EXPECT_EQ(p.verdict, Verdict::kResident);
    EXPECT_FALSE(p.command.empty());  // every registered family runs
    EXPECT_GT(p.peak, p.weights.experts);
    EXPECT_EQ(p.weights.total, mapped.total_bytes());
    // Far too little memory: no fit; a little: streaming with a budget below the experts.
    in.available = 1 << 20;
    EXPECT_EQ(project(src.ckpt, in).verdict, Verdict::kNoFit);
    ++projected;
  }
  EXPECT_EQ(projected, 12);
}

// GGUF files over HTTP: only the headers are fetched (a 4 KiB first range, then more while the
// header continues), with and without Range support, and the checkpoint equals the local one
// tensor by tensor; a split set is fetched whole from any shard; the projection is the same.
TEST(PlanSource, GgufOverHttpEqualsLocal) {
  const std::string dir = std::string(SPOOL_TEST_DATA_DIR) + "/gguf/models";
  for (bool ranges : {true, false}) {
    FileServer srv(dir, ranges);
    for (const char* name : {"qwen3_5_moe_text.q.gguf", "qwen3_next.q.gguf", "qwen3_moe.q-00002-of-00003.gguf"}) {
      SCOPED_TRACE(std::string(name) + (ranges ? " (Range)" : " (no Range)"));
      const ModelSource remote = open_source(srv.url() + name, 4096);
      const ModelSource local = open_source(dir + "/" + name);
      EXPECT_TRUE(remote.remote);
      EXPECT_FALSE(local.remote);
      expect_same_checkpoint(remote.ckpt, local.ckpt);
      ASSERT_EQ(remote.ckpt.tensors().size(), local.ckpt.tensors().size());
      for (size_t i = 0; i < local.ckpt.tensors().size(); ++i) {
        const io::TensorRef &a = remote.ckpt.tensors()[i], &b = local.ckpt.tensors()[i];
        EXPECT_EQ(a.name, b.name);
        EXPECT_EQ(a.shape, b.shape) << b.name;
        EXPECT_EQ(a.nbytes, b.nbytes) << b.name;
        EXPECT_EQ(a.shard, b.shard) << b.name;
        EXPECT_EQ(a.offset, b.offset) << b.name;
      }
      EXPECT_EQ(remote.tokenizer_json_bytes, local.tokenizer_json_bytes);
      EXPECT_GT(remote.ckpt.config().json().size(), 5u);
      // The files are 180..340 KB; their headers 3..7 KB (a few requests of doubling size).
      EXPECT_LT(remote.bytes_fetched, 64u << 10) << remote.bytes_fetched;
      // (Without Range the server writes whole files into the socket buffers: only what the
      // client reads is bounded.)
      if (ranges) EXPECT_LT(srv.body_bytes_sent(), 3 * (64u << 10));
      PlanInputs in;
      in.available = 8ull << 30;
      in.model_arg = "m";
      EXPECT_EQ(project(remote.ckpt, in).peak, project(local.ckpt, in).peak);
    }
  }
  // The split set holds the single file's tensors; the tokenizer stand-in is 0 without one.
  const ModelSource split = open_source(dir + "/qwen3_moe.q-00003-of-00003.gguf");
  const ModelSource one = open_source(dir + "/qwen3_moe.q.gguf");
  EXPECT_EQ(split.ckpt.shards().size(), 3u);
  EXPECT_EQ(split.ckpt.total_bytes(), one.ckpt.total_bytes());
  EXPECT_EQ(split.ckpt.expert_bytes(), one.ckpt.expert_bytes());
  EXPECT_EQ(one.tokenizer_json_bytes, 0u);
}

TEST(PlanSource, GgufErrorsNameTheUrl) {
  TempDir d;
  const std::string src = slurp(std::string(SPOOL_TEST_DATA_DIR) + "/gguf/models/qwen3_moe.q.gguf");
  write_file(d.path() + "/cut.gguf", src.substr(0, 3000));  // the header is longer than the file
  write_file(d.path() + "/x-00001-of-00002.gguf", slurp(std::string(SPOOL_TEST_DATA_DIR) + "/gguf/models/qwen3_moe.q-00001-of-00003.gguf"));
  for (bool ranges : {true, false}) {
    FileServer srv(d.path(), ranges);
    for (const char* name : {"cut.gguf", "missing.gguf", "x-00001-of-00002.gguf"}) {
      try {
        open_source(srv.url() + name, 1024);
        ADD_FAILURE() << name << ": no error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace spool::plan
