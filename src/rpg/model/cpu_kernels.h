// Internal: what rpg's hand-written CPU kernels (packed_gemm.cpp, decode_attention.cpp) share:
// the CPU's instruction sets, checked once, and a runtime count turned into a template
// argument for register-blocked tiles.
#pragma once

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <bit>
#include <cstdint>
#include <type_traits>

namespace rpg::model::detail {

inline bool cpu_has_avx2_fma() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}
inline bool cpu_has_avx512f() {
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
}
// AVX-512 with the byte/word (16-bit masked loads) and 256-bit-register instructions: the
// decode attention's AVX-512 form (it reads bf16 caches too).
inline bool cpu_has_avx512_bw_vl() {
  static const bool ok =
      cpu_has_avx512f() && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return ok;
}
// AVX512_BF16's VDPBF16PS: 32 bf16 products summed in pairs into 16 fp32 lanes per instruction,
// twice the multiply-adds of an fp32 FMA (on the Zen 4 VM: 232 against 115 GFLOP/s per core).
inline bool cpu_has_avx512_bf16() {
  static const bool ok = cpu_has_avx512_bw_vl() && __builtin_cpu_supports("avx512bf16");
  return ok;
}

// AMX with its bf16 tile product (TDPBF16PS: a 16 x 32 bf16 tile times a 32 x 16 one into a
// 16 x 16 fp32 tile, 16384 multiply-adds per instruction; 3.1 TFLOP/s per core on the Sapphire
// Rapids VM against ~0.2 for VDPBF16PS), and Linux's permission to use its tile registers, which
// a process must ask for once (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA; then every thread
// has it). The stores of its tiles' results use AVX512_BF16.
inline bool cpu_has_amx_bf16() {
  static const bool ok = [] {
    if (!cpu_has_avx512_bf16() || !__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16"))
      return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

// bf16 (its bits) <-> fp32 for the kernels' loops: widening is exact; narrowing rounds to nearest
// even with NaN kept quiet, as c10::BFloat16 does. Written out because c10's own forms (memcpy,
// an if on isnan) keep GCC's -O2 from vectorising the loops that use them.
inline __attribute__((always_inline)) float bf16_to_float(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}
inline __attribute__((always_inline)) uint16_t float_to_bf16(float v) {
  const uint32_t u = std::bit_cast<uint32_t>(v);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded);
}
// 16 bf16 lanes widened to fp32 (AVX-512). The all-lanes masked forms: the plain intrinsics
// trip GCC 12's -Wmaybe-uninitialized.
__attribute__((target("avx512f"))) inline __m512 widen_bf16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, h), 16));
}

// f(std::integral_constant<int, count>) for 1 <= count <= Max (a larger count runs as Max):
// a tile's row or head count as a template argument.
template <int Max, typename F>
void with_count(int64_t count, const F& f) {
  if constexpr (Max > 1)
    if (count < Max) return with_count<Max - 1>(count, f);
  f(std::integral_constant<int, Max>{});
}

}  // namespace rpg::model::detail
