// The one SVG line plotter of rpg: the run report's charts (one run or several overlaid)
// and `rpg demo --compare`'s standalone plot. Axes with "nice" ticks in data units (x in
// training steps), one colour per series, an optional TensorBoard-style EMA drawn beside the
// raw series, and data-* attributes the report's few lines of script read for nearest-point
// values. Torch-free.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace rpg::eval {

// One line: (step, value) points, finite values only, in increasing step order.
struct ChartSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;
};

struct ChartOptions {
  std::string metric;      // data-metric and <title> of the chart
  std::string y_unit;      // shown above the y axis ("s", "tokens"); empty: none
  double width = 560, height = 240;
  bool standalone = false;  // an .svg file: xmlns, white background, legend inside the picture
  // EMA weight of the smoothed copy drawn over a faded raw series (0: raw only, and no
  // smoothed copy for the report's slider to move). Series with fewer than kMinSmoothPoints
  // points are never smoothed.
  double smoothing = 0.0;
};

inline constexpr size_t kMinSmoothPoints = 10;

// The chart as an <svg class="chart"> element.
std::string line_chart_svg(const std::vector<ChartSeries>& series, const ChartOptions& options);

// The i-th series colour ("#1f77b4", ...), distinct for the first 10.
std::string series_colour(size_t i);

// Tick positions covering [lo, hi] at a 1/2/5 x 10^k spacing, about `target` of them; every
// tick lies inside [lo, hi]. `integer` restricts the spacing to whole numbers (steps).
std::vector<double> nice_ticks(double lo, double hi, int target, bool integer);

// TensorBoard's smoothing: an exponential moving average with weight w, debiased by
// 1 - w^k after k points (so the first point is kept as is).
std::vector<double> ema(const std::vector<double>& ys, double weight);

// A short human form of a number (4 significant digits, no trailing zeros).
std::string format_number(double v);

}  // namespace rpg::eval
