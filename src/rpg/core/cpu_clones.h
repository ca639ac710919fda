// RPG_CPU_CLONES: a vectorised loop compiled once per CPU level and picked at load time (the
// binaries are built without -march, so that one build runs on every x86-64 CPU).
//
// The clones: AVX-512F; x86-64-v3 (AVX2 with FMA: Haswell / Zen 1 and later); baseline SSE2.
// Why x86-64-v3 and not "avx2": GCC's "avx2" target does not include FMA, so on a CPU with
// AVX2 and no AVX-512 every a * b + c in these loops was a multiply and an add (two roundings,
// half the rate) where the AVX-512 build, and the hand-written AVX2/FMA kernels beside them,
// fuse it. The dispatcher tests x86-64-v3 as a feature level (cpuid bits), not a CPU model.
#pragma once

#if defined(__x86_64__)
#define RPG_CPU_CLONES __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#else
#define RPG_CPU_CLONES
#endif
