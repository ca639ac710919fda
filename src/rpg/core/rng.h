// Counter-based random numbers (Philox-4x32-10, Salmon et al., SC'11). A value depends
// only on (key, counter): every response, data epoch or dropout site gets its own stream
// by key, and a stream can be resumed or replayed at any position without stored state.
// That is what makes sampling independent of batch composition and resume bit-exact.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace rpg {

// One Philox-4x32-10 block: 4 random 32-bit words for a 64-bit key and 128-bit counter.
std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo);

// Mixes values into one 64-bit key (SplitMix64 finaliser over each part).
uint64_t mix_key(uint64_t a, uint64_t b);
uint64_t mix_key(uint64_t a, uint64_t b, uint64_t c);

// A stream of uniform numbers: draw i of stream `key` is a pure function of (key, i).
class RandomStream {
 public:
  explicit RandomStream(uint64_t key, uint64_t position = 0) : key_(key), position_(position) {}
  // Uniform in [0, 1) with 53 random bits.
  double uniform();
  uint64_t next_u64();
  uint64_t position() const { return position_; }
  uint64_t key() const { return key_; }

 private:
  uint64_t key_;
  uint64_t position_;
};

// A uniformly random permutation of 0..n-1 (Fisher-Yates on a RandomStream).
std::vector<int64_t> random_permutation(int64_t n, uint64_t key);

}  // namespace rpg
