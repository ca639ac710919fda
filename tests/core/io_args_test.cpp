#include <gtest/gtest.h>

#include <filesystem>

#include "rpg/core/args.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace rpg {
namespace {

TEST(Io, AtomicWriteReplacesAndLeavesNoTemporaries) {
  test::TempDir dir;
  fs::path target = dir / "sub" / "file.txt";
  write_file_atomic(target, "first");
  write_file_atomic(target, "second, longer");
  EXPECT_EQ(read_file(target), "second, longer");
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(target.parent_path())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1u);
}

TEST(Io, AtomicWriteIntoUnwritablePlaceThrowsIoError) {
  test::TempDir dir;
  test::write_text(dir / "plain", "x");
  // A regular file where a directory is needed.
  EXPECT_THROW(write_file_atomic(dir / "plain" / "child.txt", "data"), IoError);
}

TEST(Io, ReadMissingFileNamesIt) {
  try {
    read_file("/no/such/file.bin");
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/no/such/file.bin"), std::string::npos);
  }
}

TEST(Io, AppendFileCreatesThenAppendsAndNamesTheFileOnError) {
  test::TempDir dir;
  const fs::path log = dir / "samples.jsonl";
  append_file(log, "{\"step\": 1}\n");
  append_file(log, "{\"step\": 2}\n");
  append_file(log, "");
  EXPECT_EQ(read_file(log), "{\"step\": 1}\n{\"step\": 2}\n");
  try {
    append_file(dir / "missing" / "samples.jsonl", "x\n");
    FAIL() << "no error for a missing directory";
  } catch (const IoError& e) {
    EXPECT_EQ(std::string(e.what()),
              "cannot open " + (dir / "missing" / "samples.jsonl").string() + ": No such file or directory (ENOENT)");
  }
}

TEST(Io, AtomicDirPublishesOnlyOnCommit) {
  test::TempDir dir;
  fs::path final_path = dir / "ckpt";
  {
    AtomicDir d(final_path);
    test::write_text(d.path() / "a.txt", "a");
    EXPECT_FALSE(fs::exists(final_path));
  }  // no commit: discarded
  EXPECT_FALSE(fs::exists(final_path));
  size_t leftovers = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    (void)e;
    ++leftovers;
  }
  EXPECT_EQ(leftovers, 0u);
  {
    AtomicDir d(final_path);
    test::write_text(d.path() / "a.txt", "v1");
    d.commit();
  }
  EXPECT_EQ(read_file(final_path / "a.txt"), "v1");
  {
    AtomicDir d(final_path);
    test::write_text(d.path() / "b.txt", "v2");
    d.commit();
  }
  EXPECT_FALSE(fs::exists(final_path / "a.txt"));
  EXPECT_EQ(read_file(final_path / "b.txt"), "v2");
}

TEST(Args, ParsesOptionsPositionalsAndRest) {
  std::string model, out = "default";
  int64_t n = 1;
  double t = 1.0;
  bool verbose = false;
  std::vector<std::string> rest;
  ArgParser p("rpg x", "test");
  p.positional("MODEL", &model, "model").option("--out", &out, "output").option("--n", &n, "count")
      .option("--temperature", &t, "temp").flag("--verbose", &verbose, "v").rest("KEY=VALUE", &rest, "overrides");
  ASSERT_TRUE(p.parse({"m", "--n", "4", "--temperature=0.5", "a.b=1", "--verbose", "c=2", "--out", "o"}));
  EXPECT_EQ(model, "m");
  EXPECT_EQ(n, 4);
  EXPECT_DOUBLE_EQ(t, 0.5);
  EXPECT_TRUE(verbose);
  EXPECT_EQ(out, "o");
  EXPECT_EQ(rest, (std::vector<std::string>{"a.b=1", "c=2"}));
}

TEST(Args, UsageErrors) {
  auto error_of = [](std::vector<std::string> args) -> std::string {
    std::string model;
    int64_t n = 0;
    ArgParser p("rpg x", "test");
    p.positional("MODEL", &model, "model").option("--count", &n, "count");
    try {
      p.parse(args);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "<no error>";
  };
  EXPECT_NE(error_of({}).find("missing argument MODEL"), std::string::npos);
  EXPECT_NE(error_of({"m", "--cuont", "3"}).find("unknown option '--cuont'; did you mean '--count'?"),
            std::string::npos);
  EXPECT_NE(error_of({"m", "--count"}).find("--count needs a value"), std::string::npos);
  EXPECT_NE(error_of({"m", "--count", "x3"}).find("--count: expected an integer, got 'x3'"), std::string::npos);
  EXPECT_NE(error_of({"m", "extra"}).find("unexpected argument 'extra'"), std::string::npos);
}

TEST(Args, RepeatedListOption) {
  std::vector<std::string> prompts;
  ArgParser p("rpg x", "test");
  p.option_list("--prompt", &prompts, "a prompt");
  ASSERT_TRUE(p.parse({"--prompt", "a b", "--prompt=c"}));
  EXPECT_EQ(prompts, (std::vector<std::string>{"a b", "c"}));
}

TEST(Args, NegativeNumbersArePositionals) {
  std::string a;
  ArgParser p("rpg x", "test");
  p.positional("A", &a, "a");
  ASSERT_TRUE(p.parse({"-5"}));
  EXPECT_EQ(a, "-5");
}

}  // namespace
}  // namespace rpg
