#include "rpg/dist/memory.h"

#include <atomic>

namespace rpg::dist::memory {
namespace {

constexpr int kKinds = static_cast<int>(Kind::Count);
std::atomic<int64_t> g_current[kKinds];
std::atomic<int64_t> g_peak[kKinds];

void raise(int k, int64_t value) {
  int64_t p = g_peak[k].load();
  while (value > p && !g_peak[k].compare_exchange_weak(p, value)) {
  }
}

}  // namespace

void add(Kind kind, int64_t bytes) {
  const int k = static_cast<int>(kind);
  raise(k, g_current[k].fetch_add(bytes) + bytes);
}

void observe(Kind kind, int64_t bytes) { raise(static_cast<int>(kind), g_current[static_cast<int>(kind)].load() + bytes); }

int64_t current(Kind kind) { return g_current[static_cast<int>(kind)].load(); }
int64_t peak(Kind kind) { return g_peak[static_cast<int>(kind)].load(); }
void reset_peak(Kind kind) { g_peak[static_cast<int>(kind)].store(g_current[static_cast<int>(kind)].load()); }

}  // namespace rpg::dist::memory
