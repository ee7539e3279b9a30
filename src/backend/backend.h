// Backend: a compute device as the model sees it (the CPU now; CUDA and Ascend later), and the
// registry apps/ fills with the concrete backends at start-up.
//
// A backend provides its Kernels table and says which weight types it can compute on. Nothing
// below apps/ names a concrete backend: code asks the registry by name. The registry is filled
// before any engine starts and read-only afterwards.
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
  virtual const Kernels& kernels() const = 0;
  // True when matmul and embedding accept weights of type t.
  virtual bool supports_weight_type(DType t) const = 0;
};

using BackendFactory = std::function<Result<std::unique_ptr<Backend>>()>;

// Registers a backend under `name` (apps/ does this once at start-up).
void register_backend(const std::string& name, BackendFactory factory);
// Creates the backend registered as `name`; fails listing the registered names.
Result<std::unique_ptr<Backend>> create_backend(const std::string& name);
std::vector<std::string> registered_backends();

}  // namespace pagoda
