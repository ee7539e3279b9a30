// The shared vocabulary of the engine: ids that cross library boundaries.
#pragma once

#include <cstdint>

namespace pagoda {

using TokenId = int32_t;
using RequestId = uint64_t;
using BlockId = int32_t;

}  // namespace pagoda
