#include "base/status.h"

namespace pagoda {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kDataLoss: return "data loss";
    case StatusCode::kUnimplemented: return "unimplemented";
    case StatusCode::kResourceExhausted: return "resource exhausted";
    case StatusCode::kIoError: return "i/o error";
    case StatusCode::kInternal: return "internal error";
    case StatusCode::kUnavailable: return "unavailable";
  }
  return "unknown";
}

Status Status::with_context(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

}  // namespace pagoda
