// `rpg report` rendered by a real browser: headless Chromium (Debian's `chromium`, installed
// by scripts/setup.sh) loads the report from a file with network access blocked; the
// rendered DOM has one SVG chart per metric with its title and every point, each chart is
// laid out with a non-zero size, nothing is fetched, and a screenshot shows the chart lines
// inside the chart boxes. A missing Chromium fails the test. The screenshot stays in the
// build tree: <build>/test-artifacts/report_render/report.png.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "rpg/core/io.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace rpg {
namespace {

// Chromium from $RPG_CHROMIUM or PATH (chromium, then chromium-browser); empty when none.
fs::path find_chromium() {
  if (const char* env = std::getenv("RPG_CHROMIUM"); env && *env)
    return ::access(env, X_OK) == 0 ? fs::path(env) : fs::path();
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':'))
    for (const char* name : {"chromium", "chromium-browser"})
      if (::access((fs::path(dir) / name).c_str(), X_OK) == 0) return fs::path(dir) / name;
  return {};
}

// Runs headless Chromium on `url` with `args` (--dump-dom, --screenshot=...). It may run as
// root in CI (no sandbox possible), with no display, GPU or D-Bus, and must not reach the
// network or the user's profile: a throwaway HOME and profile, every host unresolvable.
test::ProcessResult chromium(const fs::path& home, const std::vector<std::string>& args, const std::string& url) {
  const fs::path bin = find_chromium();
  if (bin.empty())
    throw std::runtime_error(
        "headless Chromium not found (RPG_CHROMIUM or chromium on PATH): install the Debian 'chromium' package "
        "(scripts/setup.sh does)");
  fs::create_directories(home);
  std::vector<std::string> argv = {"/usr/bin/timeout", "120", "/usr/bin/env", "HOME=" + home.string(), bin.string(),
                                   "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                   "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                                   "--hide-scrollbars", "--force-device-scale-factor=1",
                                   "--user-data-dir=" + (home / "profile").string(),
                                   "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back(url);
  return test::run_process(argv);
}

std::string unescape_html(std::string s) {
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&amp;", "&"}}) {
    for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
      s.replace(at, from.size(), to);
  }
  return s;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Runs in the browser at the end of a copy of the report: measures every chart as laid out,
// and counts the resources the page fetched (a self-contained report fetches none).
constexpr const char* kProbe = R"JS(<script>
(() => {
  const out = {resources: performance.getEntriesByType('resource').length, charts: []};
  for (const svg of document.querySelectorAll('svg.chart')) {
    const r = svg.getBoundingClientRect();
    const line = svg.querySelector('polyline');
    const fig = svg.closest('figure');
    out.charts.push({metric: svg.getAttribute('data-metric'),
                     caption: fig ? fig.querySelector('figcaption').textContent : '',
                     x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height,
                     points: line ? line.points.numberOfItems : 0,
                     length: line ? line.getTotalLength() : 0,
                     stroke: line ? getComputedStyle(line).stroke : ''});
  }
  const pre = document.createElement('pre');
  pre.id = 'rpg-render-check';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>)JS";

TEST(ReportRender, HeadlessChromiumShowsEveryChart) {
  test::TempDir dir;
  const fs::path run = dir / "run";
  fs::create_directories(run);
  // A 30-step run's metrics (the curves the issue names: reward, validation accuracy per
  // data source every 10 steps, entropy, response length, KL, clip fraction, grad norm,
  // throughput), a sample generation and the config.
  std::map<std::string, size_t> points;
  std::string metrics;
  for (int step = 1; step <= 30; ++step) {
    nlohmann::json j = {{"step", step},
                        {"critic/score/mean", -1.0 + step / 20.0 + 0.1 * std::sin(step)},
                        {"actor/entropy", 2.0 - std::log(step)},
                        {"response_length/mean", 100 + 5 * step},
                        {"actor/ppo_kl", 0.001 * step},
                        {"actor/pg_clipfrac", 0.05 + 0.02 * std::cos(step)},
                        {"actor/grad_norm", 1.0 / step},
                        {"perf/throughput", 1000 + 10 * (step % 7)}};
    if (step % 10 == 0) {
      j["val-core/math_dapo/acc/mean@4"] = 0.1 + step / 100.0;
      j["val-core/aime25/acc/mean@4"] = 0.02 * step / 10;
    }
    for (const auto& [k, v] : j.items())
      if (k != "step") ++points[k];
    metrics += j.dump() + "\n";
  }
  test::write_text(run / "metrics.jsonl", metrics);
  test::write_text(run / "samples.jsonl",
                   "{\"step\": 30, \"prompt\": \"1+1?\", \"response\": \"Answer: 2\", \"score\": 1.0}\n");
  test::write_text(run / "config.yaml", "trainer:\n  total_training_steps: 30\n");
  auto r = test::run_process({test::rpg_binary().string(), "report", run.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const fs::path html = run / "report.html";
  const std::string source = read_file(html);
  // Self-contained by construction: no scripts, no external stylesheets or images.
  EXPECT_EQ(source.find("<script"), std::string::npos);
  EXPECT_EQ(source.find("<link"), std::string::npos);
  EXPECT_EQ(source.find(" src="), std::string::npos);

  // 1. The DOM Chromium builds from the report: one chart per metric, titled, every point.
  const fs::path home = dir / "home";
  r = chromium(home, {"--dump-dom"}, "file://" + html.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string dom = r.out;
  EXPECT_EQ(count(dom, "<svg"), points.size()) << dom.substr(0, 2000);
  for (const auto& [metric, n] : points) {
    const std::string at = "data-metric=\"" + metric + "\"";
    const size_t pos = dom.find(at);
    ASSERT_NE(pos, std::string::npos) << "no chart for " << metric;
    EXPECT_NE(dom.find("<title>" + metric + "</title>", pos), std::string::npos) << metric;
    const size_t pts = dom.find("points=\"", pos), end = dom.find('"', pts + 8);
    ASSERT_NE(pts, std::string::npos) << metric;
    EXPECT_EQ(count(dom.substr(pts + 8, end - pts - 8), ","), n) << "points of " << metric;
  }
  EXPECT_NE(dom.find("Answer: 2"), std::string::npos) << "sample generations missing";
  EXPECT_NE(dom.find("total_training_steps: 30"), std::string::npos) << "config missing";

  // 2. Layout: every chart has its size and a drawn line; nothing was fetched.
  const fs::path probe = dir / "probe.html";
  std::string copy = source;
  copy.insert(copy.rfind("</body>"), kProbe);
  test::write_text(probe, copy);
  r = chromium(home, {"--dump-dom", "--window-size=1400,2400"}, "file://" + probe.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t open = r.out.find("<pre id=\"rpg-render-check\">");
  ASSERT_NE(open, std::string::npos) << "the probe did not run: " << r.out.substr(0, 2000);
  const size_t body = r.out.find('>', open) + 1;
  const auto layout = nlohmann::json::parse(unescape_html(r.out.substr(body, r.out.find("</pre>", body) - body)));
  EXPECT_EQ(layout["resources"].get<int>(), 0) << "the report fetched something";
  ASSERT_EQ(layout["charts"].size(), points.size());
  nlohmann::json boxes = nlohmann::json::array();
  for (const auto& c : layout["charts"]) {
    const std::string metric = c["metric"].get<std::string>();
    EXPECT_EQ(c["caption"].get<std::string>().rfind(metric + " ", 0), 0u) << c.dump();
    EXPECT_EQ(c["w"].get<double>(), 320.0) << metric;
    EXPECT_EQ(c["h"].get<double>(), 140.0) << metric;
    EXPECT_EQ(c["points"].get<size_t>(), points.at(metric)) << metric;
    EXPECT_GT(c["length"].get<double>(), 100.0) << metric << ": the line is not drawn across the chart";
    EXPECT_EQ(c["stroke"].get<std::string>(), "rgb(31, 119, 180)") << metric;
    boxes.push_back({c["x"], c["y"], c["w"], c["h"]});
  }

  // 3. The screenshot (same window, the unmodified report) shows each chart's line inside its
  //    box: pixels of the line colour, counted by a standard-library PNG decoder.
  const fs::path artifacts = test::binary_dir() / "test-artifacts" / "report_render";
  fs::create_directories(artifacts);
  const fs::path shot = artifacts / "report.png";
  fs::remove(shot);
  fs::copy_file(html, artifacts / "report.html", fs::copy_options::overwrite_existing);
  r = chromium(home, {"--screenshot=" + shot.string(), "--window-size=1400,2400"}, "file://" + html.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(fs::exists(shot)) << r.err;
  test::write_text(dir / "boxes.json", boxes.dump());
  r = test::run_process({test::python().string(), (test::source_dir() / "tests/eval/png_chart_pixels.py").string(),
                         shot.string(), (dir / "boxes.json").string(), "1f77b4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto pixels = nlohmann::json::parse(r.out);
  EXPECT_EQ(pixels["width"].get<int>(), 1400);
  EXPECT_EQ(pixels["height"].get<int>(), 2400);
  for (size_t i = 0; i < boxes.size(); ++i) {
    ASSERT_LE(boxes[i][1].get<double>() + boxes[i][3].get<double>(), 2400.0) << "chart below the screenshot";
    // A polyline across a 304 px wide plot area leaves at least one line pixel per column.
    EXPECT_GE(pixels["line_per_box"][i].get<int>(), 250) << layout["charts"][i]["metric"];
  }
  EXPECT_EQ(pixels["line_total"].get<int>(), [&] {
    int s = 0;
    for (const auto& n : pixels["line_per_box"]) s += n.get<int>();
    return s;
  }()) << "line-coloured pixels outside the charts";
  std::cerr << "line pixels per chart: " << pixels["line_per_box"].dump() << "\nscreenshot: " << shot.string() << "\n";
}

}  // namespace
}  // namespace rpg
