#include "rpg/dist/world.h"

namespace rpg::dist {
namespace {
ProcessGroup* g_world = nullptr;  // deliberately leaked unless shut down
}

void init_world(const RankLayout& layout, const GroupOptions& options) {
  if (g_world) throw ValueError("dist: the world group is already initialised");
  if (!layout.distributed()) return;
  g_world = ProcessGroup::init(layout, options).release();
}

ProcessGroup* world() { return g_world; }

bool is_main() { return g_world == nullptr || g_world->rank() == 0; }

void shutdown_world() {
  if (!g_world) return;
  g_world->barrier();  // nobody leaves while another still needs the store (rank 0 hosts it)
  delete g_world;
  g_world = nullptr;
}

}  // namespace rpg::dist
