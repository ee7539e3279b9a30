#include "backend/cpu/cpu_features.h"

#include <algorithm>

namespace pagoda::cpu {

bool CpuFeatures::has(std::string_view flag) const {
  return std::find(flags.begin(), flags.end(), flag) != flags.end();
}

bool CpuFeatures::has_all(std::string_view names) const {
  while (!names.empty()) {
    const size_t end = std::min(names.find(' '), names.size());
    if (end > 0 && !has(names.substr(0, end))) return false;
    names.remove_prefix(std::min(end + 1, names.size()));
  }
  return true;
}

std::string CpuFeatures::to_string() const {
  std::string s;
  for (const std::string& flag : flags) {
    if (!s.empty()) s += ' ';
    s += flag;
  }
  return s.empty() ? "none" : s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect_cpu_features();
  return features;
}

}  // namespace pagoda::cpu
