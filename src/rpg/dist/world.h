// The process's data-parallel group ("the world"): joined once by the command
// (`rpg train` under torchrun / srun / rpg launch) and used by the trainer's hooks.
// Without a launcher there is no group: world() is nullptr and is_main() is true.
#pragma once

#include "rpg/dist/process_group.h"

namespace rpg::dist {

// Joins the group described by `layout` (no-op for one process). Throws DistError.
void init_world(const RankLayout& layout, const GroupOptions& options = {});
// The group, or nullptr when the process runs alone.
ProcessGroup* world();
// Rank 0, or a process running alone: the one that writes the run directory.
bool is_main();
// Leaves the group at the end of a successful run (every rank calls it). The group is
// otherwise never destroyed: a failing process exits without c10d's destructors.
void shutdown_world();

}  // namespace rpg::dist
