// The guarded backend's guard: its memory moves through the copy entries, and the host touching
// it directly dies (the CLI tests run whole models on it: tests/cli_test.cpp).
#include "backend/guarded/guarded_backend.h"

#include <gtest/gtest.h>

#include <vector>

namespace pagoda::guarded {
namespace {

TEST(GuardedBackend, MemoryMovesThroughItsEntriesAndTheHostTouchingItDies) {
  auto backend = GuardedBackend::create();
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  const Kernels& k = (*backend)->kernels();
  Buffer a = k.allocate(64 * sizeof(float)), b = k.allocate(64 * sizeof(float));
  std::vector<float> x(64), y(64, 5.0f), back(64);
  for (int i = 0; i < 64; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i);
  k.copy_to_device(a.data(), x.data(), 64 * sizeof(float));
  k.copy_to_device(b.data(), y.data(), 64 * sizeof(float));
  k.add(b.as<float>(), a.as<float>(), 64);  // a kernel on device memory
  k.copy_to_host(back.data(), b.data(), 64 * sizeof(float));
  for (int i = 0; i < 64; ++i) EXPECT_EQ(back[static_cast<size_t>(i)], 5.0f + static_cast<float>(i));
  // A weight uploaded from host memory is a copy in the arena.
  Buffer storage;
  const Tensor w(x.data(), DType::kF32, {8, 8});
  const Tensor up = k.upload(w, &storage);
  EXPECT_NE(up.data, w.data);
  EXPECT_EQ(up.data, storage.data());
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH({ volatile float v = *a.as<float>(); (void)v; }, "");
  EXPECT_DEATH({ *b.as<float>() = 1.0f; }, "");
  EXPECT_DEATH({ volatile float v = *static_cast<const float*>(up.data); (void)v; }, "");
}

}  // namespace
}  // namespace pagoda::guarded
