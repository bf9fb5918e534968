// ConnectionProbe: tells whether the HTTP client of the current request is still connected.
// cpp-httplib (0.11) gives handlers no access to their socket, so the probe finds it by its
// peer address among this process's sockets (getpeername over /proc/self/fd) and then polls it
// for a hang-up without reading from it.
#pragma once

#include <optional>
#include <string>

namespace spool::server {

class ConnectionProbe {
 public:
  /// The connected socket whose peer is remote_addr:remote_port (as httplib reports them:
  /// numeric host), or nullopt if none is found.
  static std::optional<ConnectionProbe> find(const std::string& remote_addr, int remote_port);

  /// False once the peer closed or reset the connection. Does not consume any input.
  bool alive() const;

 private:
  explicit ConnectionProbe(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace spool::server
