// The comparison table of `rpg demo --compare`: Start / Last / Best per method, mean and
// sample standard deviation over seeds, computed here by hand from made-up curves.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "rpg/app/demo.h"

namespace rpg::app {
namespace {

TEST(DemoCompareTable, LastBestMeanAndSampleStdOverSeeds) {
  // Seed 1: start 0.10, best after step 0 is 0.50 (at step 2), last 0.40.
  // Seed 2: start 0.20, best 0.30 (step 4 = last).
  std::vector<CompareRun> runs = {
      {"RPG-UFKL", 1, {{0, 0.10}, {2, 0.50}, {4, 0.40}}},
      {"RPG-UFKL", 2, {{0, 0.20}, {2, 0.25}, {4, 0.30}}},
      {"GRPO", 1, {{0, 0.60}, {2, 0.05}, {4, 0.05}}},  // best excludes the start (0.60)
      {"GRPO", 2, {{0, 0.60}, {2, 0.15}, {4, 0.05}}},
  };
  const std::string md = compare_table_markdown(runs, {"GRPO", "RPG-UFKL", "DAPO"}, "rpg demo --compare", "p.svg");
  // Start mean 0.15, sd sqrt(((0.05)^2 * 2) / 1) = 0.0707; last mean 0.35 sd 0.0707; best mean 0.40 sd 0.1414.
  EXPECT_NE(md.find("| RPG-UFKL | 0.1500 +- 0.0707 | 0.3500 +- 0.0707 | 0.4000 +- 0.1414 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| GRPO | 0.6000 +- 0.0000 | 0.0500 +- 0.0000 | 0.1000 +- 0.0707 |"), std::string::npos) << md;
  EXPECT_EQ(md.find("| DAPO |"), std::string::npos) << "a method without runs has no row";
  EXPECT_LT(md.find("| GRPO |"), md.find("| RPG-UFKL |")) << "rows follow the given method order";
  EXPECT_NE(md.find("mean +- std over 2 seeds"), std::string::npos);
  EXPECT_NE(md.find("](p.svg)"), std::string::npos);
}

TEST(DemoCompareTable, PlotHasOneLinePerMethodWithItsMeanCurve) {
  std::vector<CompareRun> runs = {{"A", 1, {{0, 0.0}, {10, 1.0}}}, {"A", 2, {{0, 0.0}, {10, 0.5}}},
                                  {"B", 1, {{0, 0.25}, {10, 0.25}}}};
  const std::string svg = compare_plot_svg(runs, {"A", "B"});
  size_t lines = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) ++lines;
  EXPECT_EQ(lines, 2u);
  EXPECT_NE(svg.find("<title>A</title>"), std::string::npos);
  EXPECT_NE(svg.find("class=\"legend\""), std::string::npos) << "a standalone plot names its lines";
  // The mean curves: A goes 0 -> 0.75, B stays at 0.25. Pixel heights are linear in the value,
  // so A's rise is three times the height of B over A's start.
  auto points = [&](const std::string& title) {
    const size_t end = svg.find("<title>" + title + "</title>");
    const size_t at = svg.rfind("points=\"", end) + 8;
    double x0, y0, x1, y1;
    EXPECT_EQ(std::sscanf(svg.c_str() + at, "%lf,%lf %lf,%lf", &x0, &y0, &x1, &y1), 4) << svg;
    return std::vector<double>{x0, y0, x1, y1};
  };
  const auto a = points("A"), b = points("B");
  EXPECT_NEAR((a[1] - a[3]) / (a[1] - b[1]), 3.0, 0.02) << svg;
  EXPECT_DOUBLE_EQ(b[1], b[3]);
  EXPECT_DOUBLE_EQ(a[0], b[0]);
  EXPECT_GT(a[2], a[0]);
}

TEST(DemoVerdict, SaysWhetherTheRunMetTheBar) {
  // The AVX2 seed-0 result (0.2 -> 0.196) must not read as success.
  const std::string flat = demo_verdict(0.2, 0.196);
  EXPECT_NE(flat.find("gain -0.4 points"), std::string::npos) << flat;
  EXPECT_NE(flat.find("did not clearly improve"), std::string::npos) << flat;
  const std::string small = demo_verdict(0.30, 0.40);
  EXPECT_NE(small.find("gain +10.0 points"), std::string::npos) << small;
  EXPECT_NE(small.find("less than the demo's bar of +15"), std::string::npos) << small;
  const std::string met = demo_verdict(0.346, 0.537);
  EXPECT_NE(met.find("gain +19.1 points: RL improved held-out accuracy (the demo's bar is +15)"), std::string::npos)
      << met;
  EXPECT_NE(demo_verdict(0.30, 0.45).find("RL improved held-out accuracy (the demo's bar"), std::string::npos)
      << "exactly the bar counts as met";
}

}  // namespace
}  // namespace rpg::app
