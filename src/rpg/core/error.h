// Typed errors of rpg. Library code throws one of these; `rpg` catches them once in
// cli/main.cpp and prints `rpg: error: <message>` (exit 2 for UsageError, 1 otherwise).
// Messages are one line and name the file / key / field at fault.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace rpg {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Wrong command-line usage: unknown command or flag, missing argument. Exit code 2.
class UsageError : public Error {
 public:
  using Error::Error;
};

// Configuration: malformed YAML, unknown key, wrong type, out-of-range value.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A file exists but its content is malformed (safetensors, tokenizer.json, Parquet...).
class FormatError : public Error {
 public:
  using Error::Error;
};

// Operating-system level I/O failure: cannot open, read, write, rename.
class IoError : public Error {
 public:
  using Error::Error;
};

// A value given through an API is invalid (e.g. top_p outside (0, 1]).
class ValueError : public Error {
 public:
  using Error::Error;
};

// Concatenates any streamable values into one string: str("key ", k, ": got ", v).
template <class... Args>
std::string str(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

}  // namespace rpg
