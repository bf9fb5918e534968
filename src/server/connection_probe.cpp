#include "server/connection_probe.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>

namespace spool::server {

std::optional<ConnectionProbe> ConnectionProbe::find(const std::string& remote_addr, int remote_port) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return std::nullopt;
  std::optional<ConnectionProbe> found;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd < 0) continue;
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&ss), &len) != 0) continue;
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) != 0)
      continue;
    if (remote_addr == host && remote_port == std::atoi(serv)) {
      found = ConnectionProbe(static_cast<int>(fd));
      break;
    }
  }
  closedir(d);
  return found;
}

bool ConnectionProbe::alive() const {
  pollfd p{fd_, POLLRDHUP, 0};
  if (poll(&p, 1, 0) < 0) return true;  // cannot tell: assume connected
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) == 0;
}

}  // namespace spool::server
