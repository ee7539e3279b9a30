#include "backend/backend.h"

#include <map>
#include <mutex>

namespace pagoda {

namespace {
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, BackendFactory>& registry() {
  static std::map<std::string, BackendFactory> r;
  return r;
}
}  // namespace

void register_backend(const std::string& name, BackendFactory factory) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[name] = std::move(factory);
}

Result<std::unique_ptr<Backend>> create_backend(const std::string& name, const BackendOptions& options) {
  BackendFactory factory;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = registry().find(name);
    if (it != registry().end()) factory = it->second;
  }
  if (!factory) {
    std::string known;
    for (const auto& n : registered_backends()) known += (known.empty() ? "" : ", ") + n;
    return invalid_argument("unknown backend '" + name + "' (registered: " + known + ")");
  }
  return factory(options);
}

std::vector<std::string> registered_backends() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::string> names;
  for (const auto& [name, _] : registry()) names.push_back(name);
  return names;
}

}  // namespace pagoda
