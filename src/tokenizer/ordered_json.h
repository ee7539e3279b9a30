// Reading untrusted JSON with each object's keys in the order written (nlohmann::ordered_json), in
// time linear in the text: a SAX reader that appends members without the duplicate-key scan an
// ordered object makes on each insert (a key written twice appears twice), and builds nothing of
// what it is told to skip. nlohmann's own ordered parse is quadratic in an object's keys, and its
// callback parser rescans a container's members at the end of each one: a request body of many
// small objects would keep a thread busy for hours.
//
// Used where order carries meaning: a JSON schema's properties (the order a model writes them in),
// a request's tools and tool-call arguments as a chat template renders them.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace pagoda {

// `text` parsed with its order kept; nullopt when it is not JSON or holds more than `max_keys`
// keys in all. With `only_member`, of a top-level object only that member is built (the result is
// {only_member: value}, or {} when absent).
std::optional<nlohmann::ordered_json> parse_ordered_json(std::string_view text, size_t max_keys,
                                                         const std::string* only_member = nullptr);

}  // namespace pagoda
