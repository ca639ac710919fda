#include "rpg/core/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace rpg {
namespace {

std::string read_all(std::FILE* f) {
  std::rewind(f);
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  return s;
}

TEST(Progress, FormatDuration) {
  EXPECT_EQ(format_duration(0), "00:00");
  EXPECT_EQ(format_duration(65), "01:05");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(-1), "?");
}

TEST(Progress, NonTerminalOutputIsStartAndEndLinesOnly) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressBar bar("train", 4, "step", /*log_interval_s=*/3600, f);
    for (int i = 0; i < 4; ++i) bar.advance(1, "reward=0.5");
  }
  std::string out = read_all(f);
  std::fclose(f);
  // One line when created, one when finished; nothing in between within the interval.
  ASSERT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << out;
  EXPECT_NE(out.find("train 0% |"), std::string::npos) << out;
  EXPECT_NE(out.find("train 100% |####################| 4/4 ["), std::string::npos) << out;
  EXPECT_NE(out.find("step/s] reward=0.5"), std::string::npos) << out;
  EXPECT_EQ(out.find('\r'), std::string::npos);
}

}  // namespace
}  // namespace rpg
