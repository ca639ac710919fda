#include "rpg/train/rules.h"

namespace rpg::train {

std::unique_ptr<Rules> make_rules(const TrainConfig& cfg) {
  switch (cfg.choices.semantics) {
    case Semantics::kPaper: return make_paper_rules(cfg);
    case Semantics::kFork: return make_fork_rules(cfg);
  }
  return make_paper_rules(cfg);
}

}  // namespace rpg::train
