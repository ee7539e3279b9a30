// Backend: a compute device as the model sees it (the CPU now; CUDA and Ascend later), and the
// registry launch/ fills with the concrete backends at start-up.
//
// A backend is a device: it allocates memory (its ExecContext), moves data in and out, and
// computes with its kernel table, all through Kernels (backend/kernels.h), the table bound to its
// context; and it says which weight types it can compute on. Nothing below the launcher names a
// concrete backend: code asks the registry by name. The registry is filled before any engine
// starts and read-only afterwards.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/kernels.h"
#include "base/status.h"
#include "tensor/dtype.h"

namespace pagoda {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // A human-readable line on what this backend picked (e.g. "cpu: reference kernels").
  virtual std::string description() const = 0;
  // The kernels bound to this backend's context. A copy keeps the context alive: a model keeps
  // one, so the Backend object need not outlive it.
  virtual const Kernels& kernels() const = 0;
  // True when matmul and embedding accept weights of type t.
  virtual bool supports_weight_type(DType t) const = 0;
};

// What a caller may ask of any backend it creates.
struct BackendOptions {
  int threads = 0;  // host threads for the backend's work (--threads); 0: its default
};

using BackendFactory = std::function<Result<std::unique_ptr<Backend>>(const BackendOptions&)>;

// Registers a backend under `name` (the launcher does this once at start-up).
void register_backend(const std::string& name, BackendFactory factory);
// Creates the backend registered as `name`; fails listing the registered names.
Result<std::unique_ptr<Backend>> create_backend(const std::string& name, const BackendOptions& options = {});
std::vector<std::string> registered_backends();

}  // namespace pagoda
