// exp in float for the CPU kernels' softmax-like loops (decode attention, sampling).
#pragma once

#include <bit>
#include <cstdint>

namespace rpg {

// exp(y) for y <= 0, within 2 ulp; 0 below -87 (where exp(y) < 2^-125). Cephes' expf
// reduction and polynomial, with k = round(y / ln 2) taken by the 1.5 * 2^23 shift (k stays in
// the low mantissa bits, whence 2^k's exponent field): float and integer lane operations
// only, so that a loop of them vectorises at -O2 (std::exp does not).
inline float exp_nonpositive(float y) {
  const float shifted = y * 1.44269504088896341f + 12582912.0f;
  const float k = shifted - 12582912.0f;
  const float r = y - k * 0.693359375f + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float e = p * std::bit_cast<float>((std::bit_cast<uint32_t>(shifted) + 127u) << 23);
  return y < -87.0f ? 0.0f : e;
}

}  // namespace rpg
