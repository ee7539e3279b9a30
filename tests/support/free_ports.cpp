#include "support/free_ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <random>
#include <vector>

namespace pagoda::testing {

int free_tcp_ports(int n) {
  static std::mt19937 rng(static_cast<uint32_t>(::getpid()) * 2654435761u);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int base = 10000 + static_cast<int>(rng() % 20000);
    std::vector<int> held;
    for (int i = 0; i < n; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(base + i));
      if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        if (fd >= 0) ::close(fd);
        break;
      }
      held.push_back(fd);
    }
    for (int fd : held) ::close(fd);
    if (static_cast<int>(held.size()) == n) return base;
  }
  return 0;
}

}  // namespace pagoda::testing
