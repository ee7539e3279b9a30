#include "comm/send_queue.h"

#include <utility>

namespace pagoda {

SendQueue::SendQueue(Communicator& comm) : comm_(comm), thread_([this] { run(); }) {}

SendQueue::~SendQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Status SendQueue::post(int dest, std::vector<uint8_t> bytes, bool with_size) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.ok()) return error_;
    queue_.push_back(Item{dest, with_size, std::move(bytes)});
  }
  cv_.notify_all();
  return Status::ok_status();
}

Status SendQueue::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return (queue_.empty() && !sending_) || !error_.ok(); });
  return error_;
}

void SendQueue::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty() || !error_.ok()) {
      if (stop_) return;
      queue_.clear();  // after a failure nothing more is sent
      cv_.notify_all();
      continue;
    }
    Item item = std::move(queue_.front());
    queue_.pop_front();
    sending_ = true;
    lock.unlock();
    Status st = item.with_size ? send_bytes(comm_, item.bytes, item.dest)
                               : comm_.send(item.bytes.data(), static_cast<int64_t>(item.bytes.size()), item.dest);
    lock.lock();
    sending_ = false;
    if (!st.ok() && error_.ok()) error_ = st;
    cv_.notify_all();
  }
}

}  // namespace pagoda
