// Command-line parsing for one `rpg <command>`: --name VALUE, --name=VALUE, boolean
// --flag, positionals, and a trailing list (config overrides `a.b=c`). Bad usage throws
// UsageError (exit code 2); --help prints the generated help to stdout.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace rpg {

class ArgParser {
 public:
  // `command` is the full command name ("rpg config show"), `summary` one line.
  ArgParser(std::string command, std::string summary);

  ArgParser& flag(std::string name, bool* out, std::string help);
  ArgParser& option(std::string name, std::string* out, std::string help, std::string metavar = "VALUE");
  ArgParser& option(std::string name, int64_t* out, std::string help, std::string metavar = "N");
  ArgParser& option(std::string name, double* out, std::string help, std::string metavar = "X");
  // May be given several times; each value is appended.
  ArgParser& option_list(std::string name, std::vector<std::string>* out, std::string help,
                         std::string metavar = "VALUE");
  // A required positional argument unless `required` is false.
  ArgParser& positional(std::string name, std::string* out, std::string help, bool required = true);
  // Every remaining positional argument (after the named positionals).
  ArgParser& rest(std::string name, std::vector<std::string>* out, std::string help);
  // Extra text printed at the end of --help.
  ArgParser& epilog(std::string text);

  // Returns false when --help was given (help already printed); true otherwise.
  bool parse(const std::vector<std::string>& args);
  std::string help() const;

 private:
  struct Option {
    std::string name, help, metavar;
    bool takes_value = true;
    std::function<void(const std::string&)> set;
  };
  struct Positional {
    std::string name, help;
    bool required = true;
    std::string* out = nullptr;
  };
  Option* find_option(const std::string& name);
  [[noreturn]] void usage_error(const std::string& message) const;

  std::string command_, summary_, epilog_;
  std::vector<Option> options_;
  std::vector<Positional> positionals_;
  std::string rest_name_, rest_help_;
  std::vector<std::string>* rest_ = nullptr;
};

}  // namespace rpg
