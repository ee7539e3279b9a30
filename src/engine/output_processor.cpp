#include "engine/output_processor.h"

#include <algorithm>

namespace pagoda {

SequenceOutput::SequenceOutput(const Tokenizer& tokenizer, std::vector<std::string> stop_strings,
                               bool include_stop_str, bool skip_special, bool after_text)
    : detok_(tokenizer, skip_special), stops_(std::move(stop_strings)), include_stop_(include_stop_str) {
  for (const auto& s : stops_) max_stop_len_ = std::max(max_stop_len_, s.size());
  if (after_text) detok_.continue_text();
}

bool SequenceOutput::push(TokenId id) {
  if (finished_) return false;
  const size_t old_len = text_.size();
  text_ += detok_.push(id);
  if (stops_.empty() || text_.size() == old_len) return false;
  // A match must end inside the new text, so it starts at most max_stop_len - 1 bytes earlier.
  const size_t from = old_len >= max_stop_len_ - 1 ? old_len - (max_stop_len_ - 1) : 0;
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const std::string& s : stops_) {
    size_t at = text_.find(s, from);
    if (at != std::string::npos && at < best) {
      best = at;
      best_stop = &s;
    }
  }
  if (!best_stop) return false;
  matched_stop_ = *best_stop;
  text_.resize(best + (include_stop_ ? best_stop->size() : 0));
  emitted_ = std::min(emitted_, text_.size());
  finished_ = true;
  return true;
}

void SequenceOutput::finish() {
  if (!finished_) text_ += detok_.flush();
  finished_ = true;
}

std::string SequenceOutput::take_ready_text() {
  size_t ready = text_.size();
  if (!finished_ && max_stop_len_ > 1) {
    // Hold back what could be the start of a stop string, on a UTF-8 character boundary.
    ready = text_.size() > max_stop_len_ - 1 ? text_.size() - (max_stop_len_ - 1) : 0;
    while (ready > 0 && (static_cast<unsigned char>(text_[ready]) & 0xC0) == 0x80) --ready;
  }
  if (ready <= emitted_) return {};
  std::string out = text_.substr(emitted_, ready - emitted_);
  emitted_ = ready;
  return out;
}

}  // namespace pagoda
