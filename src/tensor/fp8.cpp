#include "tensor/fp8.h"

#include <cmath>
#include <limits>

namespace pagoda {
namespace {

struct Format {
  int exp_bits, man_bits, bias;
  bool has_inf;  // E5M2: the all-ones exponent is inf / NaN; E4M3fn: only S.1111.111 is NaN
  float max;
};

constexpr Format kE4M3{4, 3, 7, false, kFp8E4M3Max};
constexpr Format kE5M2{5, 2, 15, true, kFp8E5M2Max};

float decode(const Format& f, uint8_t v) {
  const bool negative = (v & 0x80) != 0;
  const int e = (v >> f.man_bits) & ((1 << f.exp_bits) - 1);
  const int m = v & ((1 << f.man_bits) - 1);
  const int e_max = (1 << f.exp_bits) - 1;
  float out;
  if (f.has_inf && e == e_max) {
    out = m == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else if (!f.has_inf && e == e_max && m == (1 << f.man_bits) - 1) {
    out = std::numeric_limits<float>::quiet_NaN();
  } else if (e == 0) {
    out = std::ldexp(static_cast<float>(m), 1 - f.bias - f.man_bits);
  } else {
    out = std::ldexp(static_cast<float>((1 << f.man_bits) + m), e - f.bias - f.man_bits);
  }
  return negative ? -out : out;
}

uint8_t encode(const Format& f, float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return static_cast<uint8_t>(sign | 0x7F);  // NaN in both formats
  float a = std::fabs(x);
  if (a >= f.max) a = f.max;  // saturate (infinity included)
  const int emin = 1 - f.bias;  // the exponent of the smallest normal
  int e = 0;
  std::frexp(a, &e);
  e -= 1;  // a = 1.xxx * 2^e
  if (a == 0 || e < emin) e = emin;  // subnormal: the same quantum as the smallest normals
  // The value in units of the quantum 2^(e - man_bits), rounded to nearest even (exact scaling).
  const float q = std::nearbyint(std::ldexp(a, f.man_bits - e));
  int code = static_cast<int>(q);
  int biased = e + f.bias;
  if (code >= (2 << f.man_bits)) {  // rounded up to the next power of two
    code >>= 1;
    ++biased;
  }
  if (code < (1 << f.man_bits)) {
    biased = 0;  // subnormal (or zero): exponent field 0, the mantissa is the code
  }
  const uint8_t bits = static_cast<uint8_t>((biased << f.man_bits) | (code & ((1 << f.man_bits) - 1)));
  return static_cast<uint8_t>(sign | bits);
}

struct Tables {
  float e4m3[256], e5m2[256];
  Tables() {
    for (int v = 0; v < 256; ++v) {
      e4m3[v] = decode(kE4M3, static_cast<uint8_t>(v));
      e5m2[v] = decode(kE5M2, static_cast<uint8_t>(v));
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

float fp8_e4m3_to_f32(uint8_t v) { return tables().e4m3[v]; }
float fp8_e5m2_to_f32(uint8_t v) { return tables().e5m2[v]; }
uint8_t f32_to_fp8_e4m3(float x) { return encode(kE4M3, x); }
uint8_t f32_to_fp8_e5m2(float x) { return encode(kE5M2, x); }
const float* fp8_e4m3_table() { return tables().e4m3; }
const float* fp8_e5m2_table() { return tables().e5m2; }

}  // namespace pagoda
