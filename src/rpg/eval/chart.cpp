#include "rpg/eval/chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "rpg/core/text.h"

namespace rpg::eval {
namespace {

// Pixel coordinates with one decimal: enough for a 1.5 px line, half the bytes of %g.
std::string px(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// A tick label: as many decimals as the tick spacing needs, so 0.05 0.1 0.15 read as such.
std::string tick_label(double v, double spacing) {
  if (std::fabs(v) < spacing * 1e-9) v = 0.0;  // -0 and 1e-17 from accumulated steps
  char buf[32];
  const double big = std::fabs(v);
  if (spacing < 1e-4 || big >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.3g", v);
  } else {
    const int decimals = spacing >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(spacing) - 1e-9));
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  }
  return buf;
}

std::string join_numbers(const std::vector<std::pair<double, double>>& pts, bool second) {
  std::string s;
  for (const auto& p : pts) {
    if (!s.empty()) s += ' ';
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", second ? p.second : p.first);
    s += buf;
  }
  return s;
}

}  // namespace

std::string series_colour(size_t i) {
  static const char* colours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return colours[i % std::size(colours)];
}

std::string format_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::ostringstream o;
  o.precision(4);
  o << v;
  return o.str();
}

std::vector<double> nice_ticks(double lo, double hi, int target, bool integer) {
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return {lo};
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  double step = (norm < 1.5 ? 1.0 : norm < 3.0 ? 2.0 : norm < 7.0 ? 5.0 : 10.0) * mag;
  if (integer) step = std::max(1.0, std::round(step));
  std::vector<double> ticks;
  for (double k = std::ceil(lo / step - 1e-9);; k += 1.0) {
    const double t = k * step;
    if (t > hi + step * 1e-9) break;
    ticks.push_back(t == 0 ? 0.0 : t);  // never -0
  }
  return ticks;
}

std::vector<double> ema(const std::vector<double>& ys, double weight) {
  std::vector<double> out;
  out.reserve(ys.size());
  double last = 0.0;
  for (size_t k = 0; k < ys.size(); ++k) {
    last = last * weight + (1.0 - weight) * ys[k];
    const double debias = 1.0 - std::pow(weight, static_cast<double>(k + 1));
    out.push_back(debias > 0 ? last / debias : ys[k]);
  }
  return out;
}

std::string line_chart_svg(const std::vector<ChartSeries>& series, const ChartOptions& o) {
  const bool legend = o.standalone && series.size() > 1;
  const double W = o.width + (legend ? 190 : 0), H = o.height;
  const double L = 58, R = W - o.width + 14, T = 22, B = 34;
  const double pw = W - L - R, ph = H - T - B;

  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
  if (!(x1 >= x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;  // no points: empty axes
  if (x1 == x0) x0 -= 1, x1 += 1;
  if (y1 == y0) {
    const double d = y0 == 0 ? 1.0 : std::fabs(y0) * 0.1;
    y0 -= d, y1 += d;
  }
  // The y range grows to the enclosing ticks so the frame starts and ends on a labelled value.
  auto yt = nice_ticks(y0, y1, 5, false);
  const double yspacing = yt.size() > 1 ? yt[1] - yt[0] : (y1 - y0);
  if (yt.size() > 1) {
    if (yt.front() > y0 + yspacing * 1e-9) yt.insert(yt.begin(), yt.front() - yspacing);
    if (yt.back() < y1 - yspacing * 1e-9) yt.push_back(yt.back() + yspacing);
    y0 = yt.front(), y1 = yt.back();
  }
  const auto xt = nice_ticks(x0, x1, std::max(2, static_cast<int>(pw / 70)), true);
  const double xspacing = xt.size() > 1 ? xt[1] - xt[0] : 1.0;
  auto X = [&](double x) { return L + (x - x0) / (x1 - x0) * pw; };
  auto Y = [&](double y) { return T + (1.0 - (y - y0) / (y1 - y0)) * ph; };

  std::ostringstream svg;
  svg << "<svg class=\"chart\"";
  if (o.standalone) svg << " xmlns=\"http://www.w3.org/2000/svg\"";
  svg << " data-metric=\"" << html_escape(o.metric) << "\" data-x0=\"" << x0 << "\" data-x1=\"" << x1 << "\" data-y0=\""
      << y0 << "\" data-y1=\"" << y1 << "\" data-plot=\"" << L << " " << T << " " << pw << " " << ph << "\" viewBox=\"0 0 "
      << W << " " << H << "\" width=\"" << W << "\" height=\"" << H
      << "\" font-family=\"sans-serif\" font-size=\"10\"><title>" << html_escape(o.metric) << "</title>";
  if (o.standalone) svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>";
  svg << "<rect class=\"frame\" x=\"" << L << "\" y=\"" << T << "\" width=\"" << pw << "\" height=\"" << ph
      << "\" fill=\"#fafafa\" stroke=\"#bbb\"/>";
  for (double t : yt) {
    svg << "<line x1=\"" << L << "\" x2=\"" << L + pw << "\" y1=\"" << px(Y(t)) << "\" y2=\"" << px(Y(t))
        << "\" stroke=\"#e4e4e4\"/><text class=\"tick ytick\" x=\"" << L - 4 << "\" y=\"" << px(Y(t) + 3.5)
        << "\" text-anchor=\"end\" fill=\"#444\">" << tick_label(t, yspacing) << "</text>";
  }
  for (double t : xt) {
    svg << "<line x1=\"" << px(X(t)) << "\" x2=\"" << px(X(t)) << "\" y1=\"" << T + ph << "\" y2=\"" << T + ph + 4
        << "\" stroke=\"#888\"/><text class=\"tick xtick\" x=\"" << px(X(t)) << "\" y=\"" << T + ph + 15
        << "\" text-anchor=\"middle\" fill=\"#444\">" << tick_label(t, xspacing) << "</text>";
  }
  svg << "<text x=\"" << L + pw / 2 << "\" y=\"" << H - 4 << "\" text-anchor=\"middle\" fill=\"#444\">step</text>";
  if (!o.y_unit.empty()) svg << "<text x=\"4\" y=\"12\" fill=\"#444\">" << html_escape(o.y_unit) << "</text>";

  for (size_t i = 0; i < series.size(); ++i) {
    const auto& s = series[i];
    if (s.points.empty()) continue;
    const std::string colour = series_colour(i);
    // Beyond 10 series the colours repeat: the second round is dashed.
    const std::string dash = i >= 10 ? " stroke-dasharray=\"5 3\"" : "";
    const bool smooth = o.smoothing > 0 && s.points.size() >= kMinSmoothPoints;
    svg << "<g class=\"series\" data-series=\"" << html_escape(s.name) << "\" data-colour=\"" << colour
        << "\" data-steps=\"" << join_numbers(s.points, false) << "\" data-values=\"" << join_numbers(s.points, true)
        << "\">";
    if (s.points.size() == 1) {
      svg << "<circle class=\"raw\" cx=\"" << px(X(s.points[0].first)) << "\" cy=\"" << px(Y(s.points[0].second))
          << "\" r=\"3.5\" fill=\"" << colour << "\"><title>" << html_escape(s.name) << "</title></circle>";
    } else {
      svg << "<polyline class=\"raw\" fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"1.5\"" << dash
          << (smooth ? " stroke-opacity=\"0.3\"" : "") << " points=\"";
      for (const auto& [x, y] : s.points) svg << px(X(x)) << "," << px(Y(y)) << " ";
      svg << "\"><title>" << html_escape(s.name) << "</title></polyline>";
      if (smooth) {
        std::vector<double> ys;
        for (const auto& p : s.points) ys.push_back(p.second);
        const auto sm = ema(ys, o.smoothing);
        svg << "<polyline class=\"smooth\" fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"2\"" << dash
            << " points=\"";
        for (size_t k = 0; k < sm.size(); ++k) svg << px(X(s.points[k].first)) << "," << px(Y(sm[k])) << " ";
        svg << "\"/>";
      }
    }
    svg << "</g>";
    if (legend) {
      const double ly = T + 6 + 16 * static_cast<double>(i);
      svg << "<line x1=\"" << L + pw + 14 << "\" x2=\"" << L + pw + 34 << "\" y1=\"" << ly << "\" y2=\"" << ly
          << "\" stroke=\"" << colour << "\" stroke-width=\"2\"" << dash << "/><text class=\"legend\" x=\""
          << L + pw + 40 << "\" y=\"" << ly + 3.5 << "\" fill=\"#222\">" << html_escape(s.name) << "</text>";
    }
  }
  svg << "<line class=\"cursor\" x1=\"0\" x2=\"0\" y1=\"" << T << "\" y2=\"" << T + ph
      << "\" stroke=\"#999\" stroke-dasharray=\"3 3\" visibility=\"hidden\"/></svg>";
  return svg.str();
}

}  // namespace rpg::eval
