// ParallelGroup: what the executor of a tensor- or pipeline-parallel engine drives. The launcher
// (launch/ranks.h) starts the ranks and fills it in.
#pragma once

namespace pagoda {

class Communicator;
class SendQueue;

// A parallel engine's ranks as rank 0 sees them (everything must outlive the engine).
struct ParallelGroup {
  Communicator* world = nullptr;  // every rank; nullptr: one process
  int pipeline_stages = 1;
  SendQueue* sender = nullptr;    // pipeline_stages > 1: rank 0's queue of sends on `world`
  int output_rank = 0;            // pipeline_stages > 1: the last stage's first rank
};

}  // namespace pagoda
