// The `rpg` command table. Each command is a thin entry point: it parses its arguments
// and calls library code. Commands with two words ("config show") are one entry.
//
// Two binaries share the table (main.cpp): `rpg`, which runs the torch-free commands itself
// (tokenize, model info, data *, tokenizer train, report) and never loads libtorch, and
// `rpg-torch` beside it, which runs every command; `rpg` execs it for the others.
#pragma once

#include <string>
#include <vector>

#include "rpg/train/config.h"

namespace rpg::cli {

struct Command {
  std::string name;     // "config show"
  std::string summary;  // one line for `rpg --help`
  // nullptr in the `rpg` front binary for a command that needs libtorch (run by rpg-torch).
  int (*run)(const std::string& full_name, const std::vector<std::string>& args);
  // It installs rpg's SIGTERM / SIGINT handlers itself (core/signals.h): until then a stop
  // signal stays blocked and pending. Every other command runs with them unblocked.
  bool handles_stop_signals = false;
};

// `rpg train` / `rpg config show` (cmd_config.cpp): CONFIG ('-': defaults only) + overrides, bound, validated
// and resolved (aliases -> canonical keys); the loader's and resolver's notices are logged.
train::TrainConfig load_train_config(const std::string& file, const std::vector<std::string>& overrides);

// Every command, in the order `rpg --help` lists them.
const std::vector<Command>& commands();

int run_config_show(const std::string& full_name, const std::vector<std::string>& args);  // cmd_config.cpp
int run_demo(const std::string& full_name, const std::vector<std::string>& args);   // cmd_demo.cpp
int run_train(const std::string& full_name, const std::vector<std::string>& args);  // cmd_train.cpp
int run_eval(const std::string& full_name, const std::vector<std::string>& args);   // cmd_train.cpp
int run_report(const std::string& full_name, const std::vector<std::string>& args);  // cmd_report.cpp
int run_sft(const std::string& full_name, const std::vector<std::string>& args);    // cmd_sft.cpp
int run_model_info(const std::string& full_name, const std::vector<std::string>& args);  // cmd_model.cpp
int run_tokenize(const std::string& full_name, const std::vector<std::string>& args);    // cmd_model.cpp
int run_generate(const std::string& full_name, const std::vector<std::string>& args);
int run_version(const std::string& full_name, const std::vector<std::string>& args);  // cmd_config.cpp
int run_data_prepare(const std::string& full_name, const std::vector<std::string>& args);  // cmd_data.cpp
int run_data_show(const std::string& full_name, const std::vector<std::string>& args);     // cmd_data.cpp
int run_data_synth(const std::string& full_name, const std::vector<std::string>& args);    // cmd_data.cpp
int run_tokenizer_train(const std::string& full_name, const std::vector<std::string>& args);  // cmd_tokenizer.cpp
int run_model_init(const std::string& full_name, const std::vector<std::string>& args);       // cmd_init.cpp
int run_model_merge(const std::string& full_name, const std::vector<std::string>& args);      // cmd_init.cpp
int run_launch(const std::string& full_name, const std::vector<std::string>& args);           // cmd_launch.cpp
int run_plan(const std::string& full_name, const std::vector<std::string>& args);             // cmd_plan.cpp

}  // namespace rpg::cli
