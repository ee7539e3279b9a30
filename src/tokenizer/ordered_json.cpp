#include "tokenizer/ordered_json.h"

#include <utility>
#include <vector>

namespace pagoda {
namespace {

using ordered = nlohmann::ordered_json;

class OrderedBuilder : public nlohmann::json_sax<ordered> {
 public:
  OrderedBuilder(size_t max_keys, const std::string* only) : max_keys_(max_keys), only_(only) {}

  ordered root;

  bool null() override { return put(nullptr); }
  bool boolean(bool b) override { return put(b); }
  bool number_integer(number_integer_t v) override { return put(v); }
  bool number_unsigned(number_unsigned_t v) override { return put(v); }
  bool number_float(number_float_t v, const string_t&) override { return put(v); }
  bool string(string_t& s) override { return put(std::move(s)); }
  bool binary(binary_t&) override { return false; }
  bool start_object(std::size_t) override { return open(ordered::object()); }
  bool start_array(std::size_t) override { return open(ordered::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    if (skipping_ > 0) return true;
    if (++keys_ > max_keys_) return false;
    if (only_ && stack_.size() == 1 && k != *only_) {
      skip_next_ = true;  // the value of a member not asked for
      return true;
    }
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  // Adds `v` where the reader is (the root, an array's next element, or an object's member under
  // the last key), returning where it went.
  ordered* add(ordered v) {
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    ordered& parent = *stack_.back();
    if (parent.is_array()) {
      parent.get_ref<ordered::array_t&>().push_back(std::move(v));
      return &parent.get_ref<ordered::array_t&>().back();
    }
    auto& members = parent.get_ref<ordered::object_t&>();
    members.emplace_back(std::move(key_), std::move(v));  // (no scan for an earlier equal key)
    return &members.back().second;
  }
  bool put(ordered v) {
    if (skipping_ > 0 || std::exchange(skip_next_, false)) return true;
    add(std::move(v));
    return true;
  }
  bool open(ordered v) {
    if (skipping_ > 0 || std::exchange(skip_next_, false)) {
      ++skipping_;
      return true;
    }
    stack_.push_back(add(std::move(v)));
    return true;
  }
  bool close() {
    if (skipping_ > 0) {
      --skipping_;
      return true;
    }
    stack_.pop_back();
    return true;
  }

  size_t max_keys_;
  const std::string* only_;
  size_t keys_ = 0;
  std::vector<ordered*> stack_;  // the open containers (each the last child of the one before)
  std::string key_;
  bool skip_next_ = false;
  int skipping_ = 0;  // depth inside a skipped container
};

}  // namespace

std::optional<ordered> parse_ordered_json(std::string_view text, size_t max_keys, const std::string* only_member) {
  OrderedBuilder b(max_keys, only_member);
  if (!ordered::sax_parse(text.begin(), text.end(), &b)) return std::nullopt;
  return std::move(b.root);
}

}  // namespace pagoda
