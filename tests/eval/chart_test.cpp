// The one SVG plotter (eval/chart.h): tick spacing, TensorBoard's debiased EMA (worked by
// hand here), and the data -> pixel mapping checked against the chart's own tick labels.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "rpg/eval/chart.h"

namespace rpg::eval {
namespace {

void expect_ticks(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << i;
}

TEST(Chart, NiceTicks) {
  expect_ticks(nice_ticks(0.0, 0.8, 5, false), {0.0, 0.2, 0.4, 0.6, 0.8});  // 0.16 -> 0.2 apart
  expect_ticks(nice_ticks(0.0, 2.0, 5, false), {0.0, 0.5, 1.0, 1.5, 2.0});   // 0.4 -> 0.5 apart
  EXPECT_EQ(nice_ticks(1, 30, 6, true), (std::vector<double>{5, 10, 15, 20, 25, 30}));
  // Steps are whole numbers even when many ticks would fit.
  EXPECT_EQ(nice_ticks(0, 3, 10, true), (std::vector<double>{0, 1, 2, 3}));
  // 0.0073 / 5 = 0.00146 rounds to a spacing of 0.001: -0.003 ... 0.004.
  const auto small = nice_ticks(-0.0031, 0.0042, 5, false);
  ASSERT_EQ(small.size(), 8u);
  EXPECT_NEAR(small[0], -0.003, 1e-12);
  EXPECT_NEAR(small[7], 0.004, 1e-12);
}

TEST(Chart, EmaIsTensorBoardsDebiasedAverage) {
  // w = 0.6: m1 = 0.4, /0.4 = 1; m2 = 0.24 + 0.8 = 1.04, /0.64 = 1.625;
  // m3 = 0.624 + 1.2 = 1.824, /0.784 = 2.32653...
  const auto s = ema({1, 2, 3}, 0.6);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_DOUBLE_EQ(s[0], 1.0);
  EXPECT_NEAR(s[1], 1.625, 1e-12);
  EXPECT_NEAR(s[2], 1.824 / 0.784, 1e-12);
  EXPECT_EQ(ema({5, 7}, 0.0), (std::vector<double>{5, 7}));
}

// The pixel y of the tick labelled `label` (text baseline sits 3.5 px below the tick).
double tick_y(const std::string& svg, const std::string& label) {
  const std::regex re("<text class=\"tick ytick\" x=\"[0-9.]+\" y=\"([0-9.]+)\"[^>]*>" + label + "</text>");
  std::smatch m;
  if (!std::regex_search(svg, m, re)) ADD_FAILURE() << "no y tick " << label << " in " << svg;
  return m.empty() ? 0.0 : std::stod(m[1]) - 3.5;
}

double tick_x(const std::string& svg, const std::string& label) {
  const std::regex re("<text class=\"tick xtick\" x=\"([0-9.]+)\"[^>]*>" + label + "</text>");
  std::smatch m;
  if (!std::regex_search(svg, m, re)) ADD_FAILURE() << "no x tick " << label << " in " << svg;
  return m.empty() ? 0.0 : std::stod(m[1]);
}

TEST(Chart, PointsSitOnTheirTickLabels) {
  ChartOptions o;
  o.metric = "acc";
  const std::string svg = line_chart_svg({{"a", {{0, 0.0}, {4, 0.3}, {10, 0.6}}}, {"b", {{0, 0.2}, {10, 0.2}}}}, o);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(svg, m, std::regex("class=\"raw\"[^>]*points=\"([^\"]*)\"")));
  double x[3], y[3];
  ASSERT_EQ(std::sscanf(m[1].str().c_str(), "%lf,%lf %lf,%lf %lf,%lf", &x[0], &y[0], &x[1], &y[1], &x[2], &y[2]), 6);
  EXPECT_NEAR(x[0], tick_x(svg, "0"), 0.06);
  EXPECT_NEAR(x[1], tick_x(svg, "4"), 0.06);
  EXPECT_NEAR(x[2], tick_x(svg, "10"), 0.06);
  EXPECT_NEAR(y[0], tick_y(svg, "0.0"), 0.06);
  EXPECT_NEAR(y[1], tick_y(svg, "0.3"), 0.06);
  EXPECT_NEAR(y[2], tick_y(svg, "0.6"), 0.06);
  EXPECT_LT(y[2], y[0]) << "higher values are drawn higher";
  EXPECT_NE(svg.find("<title>a</title>"), std::string::npos);
  EXPECT_NE(svg.find("data-series=\"b\" data-colour=\"" + series_colour(1) + "\""), std::string::npos);
}

TEST(Chart, StandaloneHasLegendAndSmoothingOnlyForLongSeries) {
  std::vector<std::pair<double, double>> long_series;
  for (int i = 1; i <= 12; ++i) long_series.emplace_back(i, i % 3);
  ChartOptions o;
  o.metric = "m";
  o.standalone = true;
  o.smoothing = 0.6;
  const std::string svg = line_chart_svg({{"long", long_series}, {"short", {{1, 0.0}, {12, 1.0}}}}, o);
  EXPECT_NE(svg.find("xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_NE(svg.find("class=\"legend\""), std::string::npos);
  EXPECT_NE(svg.find(">long</text>"), std::string::npos);
  EXPECT_NE(svg.find(">short</text>"), std::string::npos);
  size_t smooth = 0;
  for (size_t at = svg.find("class=\"smooth\""); at != std::string::npos; at = svg.find("class=\"smooth\"", at + 1)) ++smooth;
  EXPECT_EQ(smooth, 1u) << "a 2-point series is not smoothed";
}

}  // namespace
}  // namespace rpg::eval
