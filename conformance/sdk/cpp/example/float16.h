// IEEE binary16 and bfloat16 conversions, round to nearest even (as NumPy's astype does).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace example {

inline std::uint32_t FloatBits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

inline float BitsFloat(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

inline float HalfToFloat(std::uint16_t half) {
  std::uint32_t sign = static_cast<std::uint32_t>(half & 0x8000u) << 16;
  std::uint32_t exponent = (half >> 10) & 0x1Fu;
  std::uint32_t mantissa = half & 0x3FFu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return BitsFloat(sign | 0x7F800000u | (mantissa << 13));
  return BitsFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline std::uint16_t FloatToHalf(float value) {
  std::uint32_t bits = FloatBits(value);
  auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return sign | 0x7E00u;                 // NaN stays NaN
  if (magnitude >= 0x477FF000u) return sign | 0x7C00u;                // 65520 and up round to infinity
  if (magnitude < 0x38800000u) {                                      // below 2^-14: subnormal or zero
    float units = std::nearbyint(BitsFloat(magnitude) * 16777216.0f);  // multiples of 2^-24, ties to even
    return sign | static_cast<std::uint16_t>(units);
  }
  std::uint32_t half = (((magnitude >> 23) - 112) << 10) | ((magnitude >> 13) & 0x3FFu);
  std::uint32_t rest = magnitude & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;    // a carry may reach the exponent
  return sign | static_cast<std::uint16_t>(half);
}

inline float Bfloat16ToFloat(std::uint16_t value) { return BitsFloat(static_cast<std::uint32_t>(value) << 16); }

inline std::uint16_t FloatToBfloat16(float value) {
  std::uint32_t bits = FloatBits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

}  // namespace example
