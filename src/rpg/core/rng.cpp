#include "rpg/core/rng.h"

#include <cstddef>
#include <numeric>
#include <utility>

namespace rpg {
namespace {

constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kMul0, c0, hi0, lo0);
    mulhilo(kMul1, c2, hi1, lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {c0, c1, c2, c3};
}

uint64_t mix_key(uint64_t a, uint64_t b) { return splitmix64(splitmix64(a) ^ (b + 0x632BE59BD9B4E019ull)); }
uint64_t mix_key(uint64_t a, uint64_t b, uint64_t c) { return mix_key(mix_key(a, b), c); }

uint64_t RandomStream::next_u64() {
  // Two 64-bit draws per Philox block; the position counts 64-bit draws.
  auto block = philox4x32(key_, 0, position_ >> 1);
  uint64_t v = (position_ & 1) ? (static_cast<uint64_t>(block[3]) << 32 | block[2])
                               : (static_cast<uint64_t>(block[1]) << 32 | block[0]);
  ++position_;
  return v;
}

double RandomStream::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

std::vector<int64_t> random_permutation(int64_t n, uint64_t key) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  RandomStream rs(key);
  for (int64_t i = n - 1; i > 0; --i) {
    // Unbiased bounded draw (rejection on the top of the range).
    uint64_t bound = static_cast<uint64_t>(i) + 1, limit = UINT64_MAX - UINT64_MAX % bound, x;
    do x = rs.next_u64();
    while (x >= limit);
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(x % bound)]);
  }
  return p;
}

}  // namespace rpg
