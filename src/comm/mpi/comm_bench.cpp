// All-reduce time of the communicators at the sizes tensor parallelism sends: one hidden state
// row per token after each row-parallel projection (Llama-style models: 2 per layer), f32.
//
//   comm_bench shm N [HIDDEN]          N rank processes forked here, ShmCommunicator
//   mpirun -np N comm_bench mpi [HIDDEN]  the MPI job's ranks, MpiCommunicator
//   mpirun -np N comm_bench mpi-timeout [HIDDEN]  the same with a timeout set, as during steps
//
// For 1, 16, 128 and 512 tokens of HIDDEN floats (default 2048, TinyLlama's): the median over 7
// runs of the time per all-reduce (each run long enough to take about 0.2 s), and the bus
// bandwidth as NCCL's tests count it (2 (N - 1) / N x bytes / time). Rank 0 prints a Markdown
// table.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi/mpi_communicator.h"
#include "comm/shm/shm_communicator.h"

namespace pagoda {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_for(Communicator& c, std::vector<float>& data, int iterations) {
  if (!c.barrier().ok()) std::exit(2);
  const auto start = Clock::now();
  for (int i = 0; i < iterations; ++i) {
    if (Status s = c.all_reduce_sum(data.data(), static_cast<int64_t>(data.size())); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.message().c_str());
      std::exit(2);
    }
  }
  double t = std::chrono::duration<double>(Clock::now() - start).count();
  // Every rank uses rank 0's figure (its iteration count decides the next run's too).
  if (!c.broadcast(&t, sizeof t, 0).ok()) std::exit(2);
  return t;
}

int run(Communicator& c, int64_t hidden) {
  const int n = c.size();
  if (c.rank() == 0) {
    std::printf("| communicator | ranks | tokens | bytes | time per all-reduce | bus bandwidth |\n|---|---|---|---|---|---|\n");
  }
  for (int64_t tokens : {1, 16, 128, 512}) {
    std::vector<float> data(static_cast<size_t>(tokens * hidden), 1.0f / static_cast<float>(n));
    seconds_for(c, data, 10);  // warm-up
    // Iterations for about 0.2 s per run, from a first estimate.
    int iterations = 10;
    const double first = seconds_for(c, data, iterations);
    iterations = std::clamp(static_cast<int>(0.2 / std::max(first / iterations, 1e-7)), 3, 20000);
    std::vector<double> per_op;
    for (int run = 0; run < 7; ++run) per_op.push_back(seconds_for(c, data, iterations) / iterations);
    std::sort(per_op.begin(), per_op.end());
    const double t = per_op[per_op.size() / 2];
    const double bytes = static_cast<double>(data.size() * sizeof(float));
    if (c.rank() == 0) {
      std::printf("| %s | %d | %lld | %.0f KiB | %.1f us | %.2f GB/s |\n", c.name(), n, static_cast<long long>(tokens),
                  bytes / 1024, t * 1e6, n > 1 ? 2.0 * (n - 1) / n * bytes / t / 1e9 : 0.0);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace pagoda

int main(int argc, char** argv) {
  using namespace pagoda;
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "mpi" || mode == "mpi-timeout") {
    const int64_t hidden = argc > 2 ? std::atoll(argv[2]) : 2048;
    auto world = mpi::MpiCommunicator::create_world();
    if (!world.ok()) {
      std::fprintf(stderr, "%s\n", world.status().message().c_str());
      return 2;
    }
    // As the engine runs its steps: every wait polled, with a timeout.
    if (mode == "mpi-timeout") (*world)->set_timeout(std::chrono::seconds(30));
    return run(**world, hidden);
  }
  if (mode == "shm" && argc > 2) {
    const int n = std::atoi(argv[2]);
    const int64_t hidden = argc > 3 ? std::atoll(argv[3]) : 2048;
    auto region = shm::ShmRegion::create(n);
    if (!region.ok()) {
      std::fprintf(stderr, "%s\n", region.status().message().c_str());
      return 2;
    }
    std::vector<pid_t> children;
    for (int r = 1; r < n; ++r) {
      const pid_t pid = fork();
      if (pid == 0) {
        shm::ShmCommunicator c(*region, r);
        _exit(run(c, hidden));
      }
      children.push_back(pid);
    }
    int code;
    {
      shm::ShmCommunicator c(*region, 0);
      code = run(c, hidden);
    }
    for (pid_t pid : children) {
      int status = 0;
      waitpid(pid, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) code = 1;
    }
    return code;
  }
  std::fprintf(stderr, "usage: comm_bench shm N [HIDDEN] | mpirun -np N comm_bench mpi|mpi-timeout [HIDDEN]\n");
  return 2;
}
