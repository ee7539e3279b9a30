#include "comm/communicator.h"

#include <cstring>
#include <string>

namespace pagoda {

Status broadcast_bytes(Communicator& comm, std::vector<uint8_t>& bytes, int root) {
  uint64_t size = bytes.size();
  PAGODA_RETURN_IF_ERROR(comm.broadcast(&size, sizeof size, root));
  if (comm.rank() != root) bytes.resize(size);
  return comm.broadcast(bytes.data(), static_cast<int64_t>(size), root);
}

Status send_bytes(Communicator& comm, const std::vector<uint8_t>& bytes, int dest) {
  const uint64_t size = bytes.size();
  PAGODA_RETURN_IF_ERROR(comm.send(&size, sizeof size, dest));
  return comm.send(bytes.data(), static_cast<int64_t>(size), dest);
}

Result<std::vector<uint8_t>> recv_bytes(Communicator& comm, int source, int64_t max_bytes) {
  uint64_t size = 0;
  PAGODA_RETURN_IF_ERROR(comm.recv(&size, sizeof size, source));
  if (size > static_cast<uint64_t>(max_bytes)) {
    return data_loss("rank " + std::to_string(source) + " announced a message of " + std::to_string(size) +
                     " bytes, more than the " + std::to_string(max_bytes) + " allowed");
  }
  std::vector<uint8_t> bytes(size);
  PAGODA_RETURN_IF_ERROR(comm.recv(bytes.data(), static_cast<int64_t>(size), source));
  return bytes;
}

Status LocalCommunicator::all_gather(const void* send, int64_t bytes, void* recv) {
  if (bytes > 0 && send != recv) std::memmove(recv, send, static_cast<size_t>(bytes));
  return Status::ok_status();
}

Status LocalCommunicator::broadcast(void*, int64_t, int root) {
  if (root != 0) return invalid_argument("broadcast from rank " + std::to_string(root) + " in a group of 1");
  return Status::ok_status();
}

Status LocalCommunicator::send(const void*, int64_t, int dest) {
  return invalid_argument("send to rank " + std::to_string(dest) + " in a group of 1");
}

Status LocalCommunicator::recv(void*, int64_t, int source) {
  return invalid_argument("recv from rank " + std::to_string(source) + " in a group of 1");
}

}  // namespace pagoda
