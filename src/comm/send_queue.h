// SendQueue: point-to-point sends that do not wait for the receiver. A thread of its own sends
// what is posted, in order, over a Communicator.
//
// Pipeline parallelism needs it: every stage sends forward (rank 0 its step messages, each stage
// its activations) while the last stage sends its outputs back to rank 0; if every send waited
// for its receiver, a full pipeline would wait in a circle (rank 0 sending the next step to a
// stage that is sending to the next one ... to the last, which is sending its output to rank 0).
// With the sends on a queue, a rank only ever waits to receive, for data that comes from work
// submitted before, and the pipeline drains.
//
// The communicator's send() runs on the queue's thread while the owner's thread may recv() or run
// collectives on it (Communicator's one-sender-one-receiver rule). A send that fails fails every
// later post() and flush(), with its error; the group is then unusable anyway.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "base/status.h"

namespace pagoda {

class SendQueue {
 public:
  explicit SendQueue(Communicator& comm);
  // Sends what is still queued (unless a send failed), then stops the thread.
  ~SendQueue();
  SendQueue(const SendQueue&) = delete;
  SendQueue& operator=(const SendQueue&) = delete;

  // Queues `bytes` for rank `dest`: as comm.send() (the receiver knows the size) or, with
  // `with_size`, as send_bytes() (recv_bytes() reads it). Returns the first failed send's error.
  Status post(int dest, std::vector<uint8_t> bytes, bool with_size = false);
  // Waits until everything posted so far was sent; the first failed send's error.
  Status flush();

 private:
  struct Item {
    int dest;
    bool with_size;
    std::vector<uint8_t> bytes;
  };
  void run();

  Communicator& comm_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool sending_ = false;  // the thread holds an item it took off the queue
  bool stop_ = false;
  Status error_;
  std::thread thread_;
};

}  // namespace pagoda
