// Internal to the loader: parsing untrusted JSON (config.json, safetensors headers, shard
// indexes) with nlohmann::json without letting an exception escape. Stateless; thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace pagoda::loader_internal {

// Parses `text`; fails with kDataLoss naming `source` on a syntax error or when objects/arrays
// nest deeper than `max_depth` (which bounds the parser's work on hostile input).
Result<nlohmann::json> parse_json(std::string_view text, const std::string& source, int max_depth = 64);

// A short description of a JSON value's type for error messages ("string", "array", ...).
std::string json_type_name(const nlohmann::json& j);

// Reads j[key] when it is present and not null: integers (or floats with an integral value) that
// fit int64, numbers, booleans, strings. A present value of another type fails naming `source`
// and the key. nullopt when absent or null.
Result<std::optional<int64_t>> json_int(const nlohmann::json& j, const char* key, const std::string& source);
Result<std::optional<double>> json_number(const nlohmann::json& j, const char* key, const std::string& source);
Result<std::optional<bool>> json_bool(const nlohmann::json& j, const char* key, const std::string& source);
Result<std::optional<std::string>> json_string(const nlohmann::json& j, const char* key, const std::string& source);

}  // namespace pagoda::loader_internal
