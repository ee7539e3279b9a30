#include "loader/json_util.h"

#include <cmath>
#include <exception>

namespace pagoda::loader_internal {

using nlohmann::json;

namespace {
// Thrown from the parser callback to stop parsing deeply nested input; caught below.
struct TooDeep {};
}  // namespace

Result<json> parse_json(std::string_view text, const std::string& source, int max_depth) {
  try {
    json::parser_callback_t limit = [max_depth](int depth, json::parse_event_t, json&) {
      if (depth > max_depth) throw TooDeep{};
      return true;
    };
    return json::parse(text.begin(), text.end(), limit);
  } catch (const TooDeep&) {
    return data_loss(source + ": JSON nests deeper than " + std::to_string(max_depth) + " levels");
  } catch (const std::exception& e) {
    return data_loss(source + ": invalid JSON: " + e.what());
  }
}

std::string json_type_name(const json& j) { return j.type_name(); }

namespace {
Status wrong_type(const std::string& source, const char* key, const json& v, const char* expected) {
  return data_loss(source + ": " + key + " must be " + expected + " (it is " + json_type_name(v) + ")");
}
}  // namespace

Result<std::optional<int64_t>> json_int(const json& j, const char* key, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<int64_t>();
  if (it->is_number_unsigned()) {
    uint64_t u = it->get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) {
      return data_loss(source + ": " + key + " = " + std::to_string(u) + " is out of range");
    }
    return std::optional<int64_t>(static_cast<int64_t>(u));
  }
  if (it->is_number_integer()) return std::optional<int64_t>(it->get<int64_t>());
  if (it->is_number_float()) {
    double d = it->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
      return std::optional<int64_t>(static_cast<int64_t>(d));
    }
  }
  return wrong_type(source, key, *it, "an integer");
}

Result<std::optional<double>> json_number(const json& j, const char* key, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number()) return wrong_type(source, key, *it, "a number");
  return std::optional<double>(it->get<double>());
}

Result<std::optional<bool>> json_bool(const json& j, const char* key, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<bool>();
  if (!it->is_boolean()) return wrong_type(source, key, *it, "a boolean");
  return std::optional<bool>(it->get<bool>());
}

Result<std::optional<std::string>> json_string(const json& j, const char* key,
                                               const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) return wrong_type(source, key, *it, "a string");
  return std::optional<std::string>(it->get<std::string>());
}

}  // namespace pagoda::loader_internal
