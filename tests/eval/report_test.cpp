// The run report on a long run: what it holds is bounded (the trainer rewrites it at every
// checkpoint), while what it states stays exact. A 20,000-step metrics.jsonl: each training
// chart keeps at most 1,000 points, all on a power-of-two stride plus the newest step, the
// smallest such stride; validation series keep every point; means, min/max and the constant
// test still see every value (a spike and an outlier placed on steps the chart drops);
// samples.jsonl contributes only the newest step's last 8 generations.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "rpg/eval/chart.h"
#include "rpg/eval/report.h"
#include "test_util.h"

namespace rpg::test {
namespace {

// The numbers in the data-steps attribute of the first series of the chart of `metric`.
std::vector<double> chart_steps(const std::string& html, const std::string& metric) {
  const size_t chart = html.find("data-metric=\"" + metric + "\"");
  if (chart == std::string::npos) return {};
  const std::string key = "data-steps=\"";
  const size_t at = html.find(key, chart) + key.size();
  std::istringstream in(html.substr(at, html.find('"', at) - at));
  std::vector<double> steps;
  for (double v; in >> v;) {
    steps.push_back(v);
    if (in.peek() == ',') in.ignore();
  }
  return steps;
}

TEST(ReportLongRun, ChartsAreThinnedToABoundWhileTablesAndMeansSeeEveryValue) {
  TempDir dir;
  constexpr int kSteps = 20000;
  std::string metrics;
  for (int step = 1; step <= kSteps; ++step) {
    nlohmann::json r = {{"step", step}};
    r["actor/pg_loss"] = step == 7777 ? 1e6 : std::sin(step * 0.01);  // the spike lies on an odd step
    r["timing_s/step"] = step == 5 ? 1.0 + 0.5 * kSteps : 1.0;      // the mean is 1.5 exactly
    r["actor/lr"] = 1e-6;                                              // constant
    r["actor/flat_but_one"] = step == 3 ? 2.0 : 1.0;                  // not constant (step 3 is not drawn)
    if (step % 10 == 0) r["val-core/math/acc/mean@4"] = step == 12340 ? 0.9 : 0.5 - 1e-6 * step;
    metrics += r.dump() + "\n";
  }
  write_text(dir / "metrics.jsonl", metrics);
  std::string samples;
  for (int step : {100, 200, 300})
    for (int i = 0; i < 12; ++i)
      samples += nlohmann::json({{"step", step}, {"prompt", "p" + std::to_string(step) + "_" + std::to_string(i)},
                                 {"response", "r"}, {"score", 1.0}})
                     .dump() +
                 "\n";
  write_text(dir / "samples.jsonl", samples);

  const std::string html = eval::render_report(dir.path());

  // Thinned: the smallest power-of-two stride (>= 2) leaving at most 1,000 points.
  int stride = 2;
  while (kSteps / stride + (kSteps % stride ? 1 : 0) > 1000) stride *= 2;
  ASSERT_EQ(stride, 32);
  const auto loss = chart_steps(html, "actor/pg_loss");
  ASSERT_FALSE(loss.empty());
  EXPECT_LE(loss.size(), 1000u);
  EXPECT_EQ(loss.size(), static_cast<size_t>(kSteps / stride));
  EXPECT_EQ(loss.back(), kSteps);
  for (double s : loss) EXPECT_EQ(std::fmod(s, stride), 0.0) << s;
  EXPECT_NE(html.find("20000 values logged; drawn: every step that is a multiple of 32 and the newest"), std::string::npos);
  EXPECT_NE(html.find(", max " + eval::format_number(1e6) + ")</small>"), std::string::npos)
      << "the caption's max must include the undrawn spike";

  // Validation: every point, so last/best are exact (the best lies on step 12340, not on the stride).
  EXPECT_EQ(chart_steps(html, "val-core/math/acc/mean@4").size(), static_cast<size_t>(kSteps / 10));
  EXPECT_NE(html.find("0.9000 (12340)"), std::string::npos);

  // Means over every value: 1.5, not the 1.0 of the drawn points.
  EXPECT_NE(html.find("<tr><td><b>step</b></td><td><b>1.500</b>"), std::string::npos);

  // The constant test sees every value.
  EXPECT_NE(html.find("<b>actor/lr</b> = 1e-06 at every step"), std::string::npos);
  EXPECT_EQ(html.find("<b>actor/flat_but_one</b> = 1 at every step"), std::string::npos);
  EXPECT_FALSE(chart_steps(html, "actor/flat_but_one").empty());

  // Samples: the newest step's last 8 of 12.
  EXPECT_EQ(html.find("p300_3<"), std::string::npos);
  EXPECT_NE(html.find("p300_4<"), std::string::npos);
  EXPECT_NE(html.find("p300_11<"), std::string::npos);
  EXPECT_EQ(html.find("p200_"), std::string::npos);
}

TEST(ReportLongRun, ShortSeriesKeepEveryStepAndTheNewestIsKeptWhileThinning) {
  TempDir dir;
  std::string metrics;
  for (int step = 1; step <= 1000; ++step) metrics += nlohmann::json({{"step", step}, {"actor/pg_loss", step}}).dump() + "\n";
  write_text(dir / "metrics.jsonl", metrics);
  std::string html = eval::render_report(dir.path());
  EXPECT_EQ(chart_steps(html, "actor/pg_loss").size(), 1000u);
  EXPECT_EQ(html.find("values logged; drawn"), std::string::npos);

  // One more step: thinned to the even steps; an odd newest step is kept while it is newest.
  metrics += nlohmann::json({{"step", 1001}, {"actor/pg_loss", 1001}}).dump() + "\n";
  write_text(dir / "metrics.jsonl", metrics);
  html = eval::render_report(dir.path());
  const auto steps = chart_steps(html, "actor/pg_loss");
  ASSERT_EQ(steps.size(), 501u);
  EXPECT_EQ(steps.front(), 2);
  EXPECT_EQ(steps[499], 1000);
  EXPECT_EQ(steps.back(), 1001);
}

}  // namespace
}  // namespace rpg::test
