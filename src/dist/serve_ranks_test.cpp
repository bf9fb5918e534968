// `mpirun -n 2 spool serve` (docs/distributed.md#serving-over-ranks): rank 0 serves HTTP, rank 1
// serves its half of the experts of every MoE layer rank 0 runs. The greedy replies (one at a time
// and concurrent ones, batched over two slots) equal a single-process server's; SIGTERM to mpirun
// stops every rank; a rank that cannot start (rank 0's port taken) ends the whole job, no hang.
#include <gtest/gtest.h>
#include <httplib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

const std::string kSpool = std::string(SPOOL_BINARY_DIR) + "/spool";
const std::string kMpirun = std::string(SPOOL_MPIEXEC) + " --allow-run-as-root --oversubscribe -n 2 ";
const std::string kFlags = " --threads 1 --ctx-size 256 --prefill-step-size 16 --parallel 2";

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Waits for pid to exit for at most `seconds`; its wait status, or -1 when it is still running.
int wait_exit(pid_t pid, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return -1;
}

// The child process of `parent` whose environment holds `env` (NAME=VALUE), or -1.
pid_t child_of(pid_t parent, const std::string& env) {
  for (const auto& d : std::filesystem::directory_iterator("/proc")) {
    const std::string name = d.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::istringstream stat(slurp(d.path().string() + "/stat"));
    std::string pid, comm, state;
    long ppid = 0;
    stat >> pid >> comm >> state >> ppid;
    if (ppid != parent) continue;
    std::string e = slurp(d.path().string() + "/environ");
    for (char& c : e)
      if (c == '\0') c = '\n';
    if (("\n" + e).find("\n" + env + "\n") != std::string::npos) return static_cast<pid_t>(std::stol(name));
  }
  return -1;
}

// A server started by `prefix spool serve ARGS` on a free port (or `port`), stopped by SIGTERM
// to the process started (mpirun, which forwards it) when destroyed.
struct Server {
  Server(const std::string& prefix, const std::string& args, const std::string& tag, int port_arg = 0) {
    log = ::testing::TempDir() + "/serve_ranks_" + tag + "_" + std::to_string(getpid()) + ".log";
    pid = ::fork();
    if (pid == 0) {
      const std::string cmd = "exec " + prefix + kSpool + " serve --port " + std::to_string(port_arg) + " " + args + " 2>" + log + " >/dev/null";
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  // Waits for "listening on" and /health 200; false when the process ended or 120 s passed.
  bool ready() {
    for (int i = 0; i < 1200; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return false;
      }
      const std::string l = slurp(log);
      const size_t at = l.find("listening on http://127.0.0.1:");
      if (at == std::string::npos) continue;
      const int p = std::atoi(l.c_str() + at + 30);
      httplib::Client c("127.0.0.1", p);
      auto r = c.Get("/health");
      if (r && r->status == 200) {
        port = p;
        return true;
      }
    }
    return false;
  }
  // SIGTERM; the wait status, or -1 when it had not ended after `seconds` (then killed).
  int stop(double seconds = 60) {
    if (pid <= 0) return 0;
    ::kill(pid, SIGTERM);
    const int st = wait_exit(pid, seconds);
    if (st == -1) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    pid = -1;
    return st;
  }
  ~Server() {
    stop();
    std::remove(log.c_str());
  }
  // The greedy reply to one user message (content and the usage's token counts).
  std::string chat(const std::string& user, int max_tokens = 12) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(300, 0);
    const nlohmann::json body = {{"messages", {{{"role", "user"}, {"content", user}}}}, {"max_tokens", max_tokens}, {"temperature", 0}};
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    if (!r) return "<no reply>";
    if (r->status != 200) return "<status " + std::to_string(r->status) + ": " + r->body + ">";
    const auto j = nlohmann::json::parse(r->body);
    return j["choices"][0]["message"].value("content", std::string()) + " | " + j["usage"].dump();
  }
  pid_t pid = -1;
  int port = 0;
  std::string log;
};

const std::vector<std::string> kPrompts = {"Tell me about the sea.", "What is two plus two?", "Write a line of a poem about mountains.",
                                           "hi"};

TEST(ServeRanks, GreedyRepliesEqualOneProcess) {
  std::vector<std::string> want;
  {
    Server one("", kFlags, "one");
    ASSERT_TRUE(one.ready()) << slurp(one.log);
    for (const std::string& p : kPrompts) want.push_back(one.chat(p));
  }
  Server two(kMpirun, kFlags, "two");
  ASSERT_TRUE(two.ready()) << slurp(two.log);
  EXPECT_NE(slurp(two.log).find("rank 1 of 2 (mpi), experts [32, 64) of 64 here; rank 0 leads"), std::string::npos) << slurp(two.log);
  for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_EQ(two.chat(kPrompts[i]), want[i]) << kPrompts[i];
  // Concurrent requests: two slots decode together (one forward_batch over both sequences).
  std::vector<std::string> got(kPrompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < kPrompts.size(); ++i) clients.emplace_back([&, i] { got[i] = two.chat(kPrompts[i]); });
  for (std::thread& t : clients) t.join();
  for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_EQ(got[i], want[i]) << "concurrent: " << kPrompts[i];
  // SIGTERM to rank 0 alone (as mpirun forwards it): it stops the server, then tells rank 1 to
  // leave its loop; every rank ends with status 0 (mpirun kills nobody).
  const pid_t rank0 = child_of(two.pid, "OMPI_COMM_WORLD_RANK=0");
  ASSERT_GT(rank0, 0);
  ::kill(rank0, SIGTERM);
  const int st = wait_exit(two.pid, 60);
  EXPECT_NE(st, -1) << "mpirun did not end within 60 s of SIGTERM to rank 0: " << slurp(two.log);
  if (st != -1) {
    two.pid = -1;
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << slurp(two.log);
  }
  const std::string l = slurp(two.log);
  EXPECT_NE(l.find("signal 15: stopping"), std::string::npos) << l;
  EXPECT_EQ(l.find("cannot follow"), std::string::npos) << l;
}

// SIGTERM to mpirun itself (forwarded to every rank): rank 0 stops, the job ends, no hang.
TEST(ServeRanks, SigtermToMpirunEndsTheJob) {
  Server two(kMpirun, kFlags, "term");
  ASSERT_TRUE(two.ready()) << slurp(two.log);
  EXPECT_NE(two.chat(kPrompts[0]).find("completion_tokens"), std::string::npos);
  EXPECT_NE(two.stop(60), -1) << "mpirun did not end within 60 s of SIGTERM: " << slurp(two.log);
  EXPECT_NE(slurp(two.log).find("signal 15: stopping"), std::string::npos) << slurp(two.log);
}

// Balanced owners from a routing trace the single-process server records: the same replies.
TEST(ServeRanks, BalancedOwnersFromATrace) {
  const std::string trace = ::testing::TempDir() + "/serve_ranks_trace_" + std::to_string(getpid()) + ".jsonl";
  std::vector<std::string> want;
  {
    Server one("", kFlags + " --trace-out " + trace, "trace");
    ASSERT_TRUE(one.ready()) << slurp(one.log);
    for (const std::string& p : kPrompts) want.push_back(one.chat(p));
  }
  Server two(kMpirun, kFlags + " --expert-owners " + trace, "balanced");
  ASSERT_TRUE(two.ready()) << slurp(two.log);
  EXPECT_NE(slurp(two.log).find("experts balanced by load over 8 layers"), std::string::npos) << slurp(two.log);
  for (size_t i = 0; i < kPrompts.size(); ++i) EXPECT_EQ(two.chat(kPrompts[i]), want[i]) << kPrompts[i];
  EXPECT_NE(two.stop(60), -1) << slurp(two.log);
  std::remove(trace.c_str());
}

// Rank 0 cannot bind its port (a socket of this test listens there): every rank ends, with exit
// status 1 from rank 0 naming the port, instead of rank 1 waiting for a leader that is gone.
TEST(ServeRanks, RankZeroFailingToStartEndsTheJob) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  Server two(kMpirun, kFlags, "clash", port);
  const int st = wait_exit(two.pid, 90);
  ::close(fd);
  ASSERT_NE(st, -1) << "mpirun still running 90 s after rank 0 failed to bind: " << slurp(two.log);
  two.pid = -1;
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) != 0) << st;
  const std::string l = slurp(two.log);
  EXPECT_NE(l.find("cannot listen on 127.0.0.1:" + std::to_string(port)), std::string::npos) << l;
  EXPECT_NE(l.find("1 other rank(s) of this mpirun failed to start"), std::string::npos) << l;
}

}  // namespace
