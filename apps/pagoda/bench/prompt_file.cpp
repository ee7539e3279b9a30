#include "apps/pagoda/bench/prompt_file.h"

#include <fstream>
#include <nlohmann/json.hpp>

namespace pagoda::app::bench {

Result<std::vector<FilePrompt>> read_prompt_file(const std::string& path, int64_t max_prompts,
                                                 int64_t default_output_len) {
  std::ifstream in(path);
  if (!in) return Status(StatusCode::kIoError, path + ": cannot open");
  std::vector<FilePrompt> out;
  std::string line;
  int64_t line_no = 0;
  while (static_cast<int64_t>(out.size()) < max_prompts && std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("prompt") || !j["prompt"].is_string()) {
      return invalid_argument(path + ":" + std::to_string(line_no) + ": expected {\"prompt\": \"...\"}");
    }
    FilePrompt p;
    p.prompt = j["prompt"];
    p.output_len = j.contains("output_len") && j["output_len"].is_number_integer() ? j["output_len"].get<int64_t>()
                                                                                    : default_output_len;
    if (p.output_len < 1) return invalid_argument(path + ":" + std::to_string(line_no) + ": output_len must be >= 1");
    out.push_back(std::move(p));
  }
  if (out.empty()) return invalid_argument(path + ": no prompts");
  return out;
}

}  // namespace pagoda::app::bench
