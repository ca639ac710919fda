// `rpg report` rendered by a real browser: headless Chromium (Debian's `chromium`, installed
// by scripts/setup.sh) loads the report from a file with network access blocked; the
// rendered DOM has one SVG chart per metric with its title and every point, every chart is
// laid out at the same size with its axis tick labels inside the chart box, nothing is
// fetched, and a screenshot shows the chart lines inside the chart boxes. A comparison of
// three runs has a legend naming them and a Table 3 whose values equal those an independent
// Python script computes from the runs' metrics.jsonl. Runs with one step, no validation or
// NaN values give a valid page that says why a chart is missing. A missing Chromium fails
// the test. Screenshots stay in the build tree: <build>/test-artifacts/report_render/.
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

// Runs in the browser at the end of a copy of the report: measures every chart and its tick
// labels as laid out, reads the legend and the Table 3 cells, and counts the resources the
// page fetched (a self-contained report fetches none).
constexpr const char* kProbe = R"JS(<script>
(() => {
  const box = e => { const r = e.getBoundingClientRect(); return {x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height}; };
  const out = {resources: performance.getEntriesByType('resource').length, charts: [], legend: [], cells: [],
               notes: Array.from(document.querySelectorAll('ul.nochart li, p.note')).map(e => e.textContent)};
  for (const svg of document.querySelectorAll('svg.chart')) {
    const fig = svg.closest('figure');
    const lines = Array.from(svg.querySelectorAll('polyline.raw'));
    const smooth = svg.querySelector('polyline.smooth[visibility="visible"], polyline.smooth:not([visibility])');
    const c = Object.assign(box(svg), {metric: svg.getAttribute('data-metric'),
        caption: fig ? fig.querySelector('figcaption').textContent : '',
        series: Array.from(svg.querySelectorAll('g.series')).map(g => g.dataset.series),
        points: lines.map(l => l.points.numberOfItems),
        length: lines.length ? lines[0].getTotalLength() : 0,
        stroke: lines.length ? getComputedStyle(lines[0]).stroke : '',
        smooth_length: smooth ? smooth.getTotalLength() : 0,
        xticks: [], yticks: []});
    for (const t of svg.querySelectorAll('text.xtick')) c.xticks.push(Object.assign(box(t), {text: t.textContent}));
    for (const t of svg.querySelectorAll('text.ytick')) c.yticks.push(Object.assign(box(t), {text: t.textContent}));
    out.charts.push(c);
  }
  for (const li of document.querySelectorAll('ul.legend li')) out.legend.push(li.textContent);
  // Hover: a mouse move over the middle of the first chart's plot area fills its readout with
  // the nearest step's values. Smoothing: the slider at 0 hides the smoothed lines.
  const first = document.querySelector('svg.chart');
  if (first) {
    const p = first.dataset.plot.split(' ').map(Number), r = first.getBoundingClientRect();
    first.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + p[0] + p[2] / 2, clientY: r.top + p[1] + p[3] / 2, bubbles: true}));
    out.hover = first.closest('figure').querySelector('.readout').textContent;
  }
  const slider = document.getElementById('smoothing');
  out.smooth_visible_default = document.querySelectorAll('polyline.smooth[visibility="visible"], polyline.smooth:not([visibility])').length;
  slider.value = '0';
  slider.dispatchEvent(new Event('input'));
  out.smooth_visible_at_0 = document.querySelectorAll('polyline.smooth[visibility="visible"]').length;
  slider.value = '0.6';
  slider.dispatchEvent(new Event('input'));
  for (const td of document.querySelectorAll('table.table3 td[data-col]'))
    out.cells.push({run: td.dataset.run, metric: td.dataset.metric, col: td.dataset.col, text: td.textContent});
  out.all_cells = [];
  for (const td of document.querySelectorAll('table.allval td[data-col]'))
    out.all_cells.push({run: td.dataset.run, metric: td.dataset.metric, col: td.dataset.col, text: td.textContent});
  const pre = document.createElement('pre');
  pre.id = 'rpg-render-check';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>)JS";

// Loads a copy of `html` with kProbe appended in Chromium and returns what the probe saw.
nlohmann::json probe(const fs::path& dir, const fs::path& html, const std::string& window) {
  std::string copy = read_file(html);
  copy.insert(copy.rfind("</body>"), kProbe);
  const fs::path page = dir / (html.stem().string() + "_probe.html");
  test::write_text(page, copy);
  auto r = chromium(dir / "home", {"--dump-dom", "--window-size=" + window}, "file://" + page.string());
  if (r.exit_code != 0) throw std::runtime_error("chromium failed: " + r.err);
  const size_t open = r.out.find("<pre id=\"rpg-render-check\">");
  if (open == std::string::npos) throw std::runtime_error("the probe did not run: " + r.out.substr(0, 2000));
  const size_t body = r.out.find('>', open) + 1;
  return nlohmann::json::parse(unescape_html(r.out.substr(body, r.out.find("</pre>", body) - body)));
}

// Every tick label lies inside its chart's box; an x axis and a y axis have at least two.
void expect_ticks_inside(const nlohmann::json& c) {
  const std::string metric = c["metric"];
  EXPECT_GE(c["xticks"].size(), 2u) << metric;
  EXPECT_GE(c["yticks"].size(), 2u) << metric;
  for (const char* axis : {"xticks", "yticks"})
    for (const auto& t : c[axis]) {
      EXPECT_GT(t["w"].get<double>(), 0.0) << metric << " " << t.dump();
      EXPECT_GE(t["x"].get<double>(), c["x"].get<double>()) << metric << " " << axis << " " << t.dump();
      EXPECT_GE(t["y"].get<double>(), c["y"].get<double>()) << metric << " " << axis << " " << t.dump();
      EXPECT_LE(t["x"].get<double>() + t["w"].get<double>(), c["x"].get<double>() + c["w"].get<double>()) << metric << " " << t.dump();
      EXPECT_LE(t["y"].get<double>() + t["h"].get<double>(), c["y"].get<double>() + c["h"].get<double>()) << metric << " " << t.dump();
    }
}

// Counts pixels of colour `hex` inside each box of a screenshot; returns the decoder's JSON.
nlohmann::json line_pixels(const fs::path& dir, const fs::path& shot, const nlohmann::json& boxes, const std::string& hex) {
  test::write_text(dir / "boxes.json", boxes.dump());
  auto r = test::run_process({test::python().string(), (test::source_dir() / "tests/eval/png_chart_pixels.py").string(),
                              shot.string(), (dir / "boxes.json").string(), hex});
  if (r.exit_code != 0) throw std::runtime_error(r.err);
  return nlohmann::json::parse(r.out);
}

fs::path artifacts_dir() {
  const fs::path artifacts = test::binary_dir() / "test-artifacts" / "report_render";
  fs::create_directories(artifacts);
  return artifacts;
}

TEST(ReportRender, HeadlessChromiumShowsEveryChart) {
  test::TempDir dir;
  const fs::path run = dir / "run";
  fs::create_directories(run);
  // A 30-step run's metrics (the curves the issue names: reward, validation accuracy per
  // data source every 10 steps, entropy, response length, KL, clip fraction, grad norm,
  // throughput, step time), a constant one, a sample generation and the config.
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
                        {"perf/throughput", 1000 + 10 * (step % 7)},
                        {"timing_s/step", 2.0 + 0.1 * (step % 3)},
                        {"timing_s/gen", 1.5}};
    if (step % 10 == 0) {
      j["val-core/math_dapo/acc/mean@4"] = 0.1 + step / 100.0;
      j["val-core/aime25/acc/mean@4"] = 0.02 * step / 10;
    }
    for (const auto& [k, v] : j.items())
      if (k != "step" && k != "timing_s/gen") ++points[k];
    j["train/epoch"] = 0;  // constant: one line of text, no chart
    metrics += j.dump() + "\n";
  }
  test::write_text(run / "metrics.jsonl", metrics);
  test::write_text(run / "samples.jsonl",
                   "{\"step\": 30, \"prompt\": \"1+1?\", \"response\": \"Answer: 2\", \"score\": 1.0}\n");
  test::write_text(run / "config.yaml",
                   "actor_rollout_ref:\n  model:\n    path: Qwen/Qwen3-4B\n  actor:\n    policy_loss: rpg_reinforce\n"
                   "    kl_form: ufkl\n    use_kl_loss: true\n    kl_loss_coef: 0.0001\n    kl_loss_type: low_var_kl\n"
                   "    clip_ratio_low: 0.2\n    clip_ratio_high: 0.28\n    optim:\n      lr: 1.0e-06\n"
                   "  rollout:\n    n: 16\ndata:\n  train_batch_size: 512\ntrainer:\n  total_training_steps: 400\n");
  const std::string algorithm = "paper semantics: rpg_reinforce (ufkl), RPG-Style Clip (0.2, 0.28), KL x 0.0001";
  test::write_text(run / "algorithm.txt", algorithm + "\n");
  auto r = test::run_process({test::rpg_binary().string(), "report", run.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const fs::path html = run / "report.html";
  const std::string source = read_file(html);
  // Self-contained: one inline script (smoothing slider, hover values), no external
  // scripts, stylesheets or images.
  EXPECT_EQ(count(source, "<script"), 1u);
  EXPECT_EQ(source.find("<link"), std::string::npos);
  EXPECT_EQ(source.find(" src="), std::string::npos);

  // 1. The DOM Chromium builds from the report: summary first, one chart per varying metric,
  //    titled, every point; the constant metric is a line of text.
  const fs::path home = dir / "home";
  r = chromium(home, {"--dump-dom"}, "file://" + html.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string dom = r.out;
  EXPECT_EQ(count(dom, "<svg"), points.size()) << dom.substr(0, 2000);
  for (const auto& [metric, n] : points) {
    const std::string at = "data-metric=\"" + metric + "\"";
    const size_t pos = dom.find("<svg class=\"chart\" " + at);
    ASSERT_NE(pos, std::string::npos) << "no chart for " << metric;
    EXPECT_NE(dom.find("<title>" + metric + "</title>", pos), std::string::npos) << metric;
    const size_t pts = dom.find("points=\"", pos), end = dom.find('"', pts + 8);
    ASSERT_NE(pts, std::string::npos) << metric;
    EXPECT_EQ(count(dom.substr(pts + 8, end - pts - 8), ","), n) << "points of " << metric;
  }
  EXPECT_NE(dom.find("<b>train/epoch</b> = 0 at every step (1–30)"), std::string::npos) << "constant metric not collapsed";
  EXPECT_NE(dom.find("Answer: 2"), std::string::npos) << "sample generations missing";
  EXPECT_NE(dom.find("total_training_steps: 400"), std::string::npos) << "config missing";
  // The summary: config essentials and held-out start -> last (best, step) before any chart.
  const size_t charts_at = dom.find("<svg");
  for (const std::string& want : std::vector<std::string>{"Qwen/Qwen3-4B", "<td>" + algorithm + "</td>", "1.0e-06",
                           "512 x 16", "30 / 400", "math_dapo/acc/mean@4</td><td>0.2000 (10)</td><td>→</td><td>0.4000 (30)</td><td data-metric=\"val-core/math_dapo/acc/mean@4\">0.4000 (30)",
                           "<td>generation</td><td>1.500</td>"}) {
    const size_t at = dom.find(want);
    EXPECT_NE(at, std::string::npos) << want;
    EXPECT_LT(at, charts_at) << want << " is not in the summary above the charts";
  }
  // Key panels first: validation, score, response length, KL, entropy, grad norm, clip, time.
  std::vector<size_t> order;
  for (const char* m : {"val-core/aime25/acc/mean@4", "critic/score/mean", "response_length/mean", "actor/ppo_kl",
                        "actor/entropy", "actor/grad_norm", "actor/pg_clipfrac", "timing_s/step", "perf/throughput"})
    order.push_back(dom.find(std::string("<svg class=\"chart\" data-metric=\"") + m + "\""));
  EXPECT_TRUE(std::is_sorted(order.begin(), order.end())) << "key panels out of order";

  // 2. Layout: every chart the same size with its ticks inside it and a drawn line (the
  //    smoothed copy over the 30-point series); nothing was fetched.
  const auto layout = probe(dir.path(), html, "1280,3000");
  EXPECT_EQ(layout["resources"].get<int>(), 0) << "the report fetched something";
  ASSERT_EQ(layout["charts"].size(), points.size());
  // The first chart is validation accuracy (aime25, then math_dapo): the middle of steps
  // 10..30 is step 20, value 0.02 * 20 / 10.
  EXPECT_EQ(layout["hover"].get<std::string>(), "step 20:  0.04") << layout["hover"];
  EXPECT_GT(layout["smooth_visible_default"].get<int>(), 0);
  EXPECT_EQ(layout["smooth_visible_at_0"].get<int>(), 0) << "the slider at 0 leaves smoothed lines";
  nlohmann::json boxes = nlohmann::json::array();
  for (const auto& c : layout["charts"]) {
    const std::string metric = c["metric"].get<std::string>();
    EXPECT_EQ(c["caption"].get<std::string>().rfind(metric + " ", 0), 0u) << c.dump();
    EXPECT_EQ(c["w"].get<double>(), 560.0) << metric;
    EXPECT_EQ(c["h"].get<double>(), 240.0) << metric;
    ASSERT_EQ(c["points"].size(), 1u) << metric;
    EXPECT_EQ(c["points"][0].get<size_t>(), points.at(metric)) << metric;
    EXPECT_GT(c["length"].get<double>(), 400.0) << metric << ": the line is not drawn across the chart";
    EXPECT_EQ(c["stroke"].get<std::string>(), "rgb(31, 119, 180)") << metric;
    if (points.at(metric) >= 10) {
      EXPECT_GT(c["smooth_length"].get<double>(), 400.0) << metric << ": no smoothed line";
    }
    expect_ticks_inside(c);
    // The x axis is in steps: integer labels within 1..30.
    for (const auto& t : c["xticks"]) {
      const double v = std::stod(t["text"].get<std::string>());
      EXPECT_EQ(v, std::round(v)) << metric;
      EXPECT_TRUE(v >= 1 && v <= 30) << metric << " " << v;
    }
    boxes.push_back({c["x"], c["y"], c["w"], c["h"]});
  }

  // 3. The screenshot (same window, the unmodified report) shows each chart's line inside its
  //    box: pixels of the line colour, counted by a standard-library PNG decoder.
  const fs::path shot = artifacts_dir() / "report.png";
  fs::remove(shot);
  fs::copy_file(html, artifacts_dir() / "report.html", fs::copy_options::overwrite_existing);
  r = chromium(home, {"--screenshot=" + shot.string(), "--window-size=1280,3000"}, "file://" + html.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(fs::exists(shot)) << r.err;
  const auto pixels = line_pixels(dir.path(), shot, boxes, "1f77b4");
  EXPECT_EQ(pixels["width"].get<int>(), 1280);
  EXPECT_EQ(pixels["height"].get<int>(), 3000);
  for (size_t i = 0; i < boxes.size(); ++i) {
    ASSERT_LE(boxes[i][1].get<double>() + boxes[i][3].get<double>(), 3000.0) << "chart below the screenshot";
    // A line across a 488 px wide plot area leaves at least one line pixel per column.
    EXPECT_GE(pixels["line_per_box"][i].get<int>(), 450) << layout["charts"][i]["metric"];
  }
  EXPECT_EQ(pixels["line_total"].get<int>(), [&] {
    int s = 0;
    for (const auto& n : pixels["line_per_box"]) s += n.get<int>();
    return s;
  }()) << "line-coloured pixels outside the charts";
  std::cerr << "line pixels per chart: " << pixels["line_per_box"].dump() << "\nscreenshot: " << shot.string() << "\n";
}

// Three runs compared (`rpg report A B C --out compare.html --markdown`): every chart overlays
// the runs that logged the metric, with ticks inside its box; the legend names the 3 runs; the
// Table 3 cells (HTML and Markdown) equal an independent computation from metrics.jsonl.
TEST(ReportRender, ThreeRunComparisonTable3AndLegend) {
  test::TempDir dir;
  const std::vector<std::string> names = {"grpo", "dapo", "rpg_reinforce_ufkl"};
  std::vector<std::string> argv = {test::rpg_binary().string(), "report"};
  for (size_t i = 0; i < names.size(); ++i) {
    const fs::path run = dir / "runs" / names[i];
    fs::create_directories(run);
    std::string metrics;
    const int steps = 20 + 5 * static_cast<int>(i);  // runs of different lengths
    for (int step = 0; step <= steps; ++step) {
      nlohmann::json j = {{"step", step}};
      if (step > 0) {
        j["critic/score/mean"] = -0.5 + 0.03 * step * (1 + 0.2 * i) + 0.05 * std::sin(step + i);
        j["actor/entropy"] = 1.5 - 0.02 * step * (i + 1);
        j["response_length/mean"] = 200 + 3 * step + 20 * i;
      }
      if (step % 5 == 0) {
        // Accuracy rises then (run 0) falls back: last != best.
        j["val-core/aime24/acc/mean@32"] = 0.1 + 0.01 * step * (i + 1) - (i == 0 && step > 10 ? 0.012 * (step - 10) : 0.0);
        // Run 2 starts higher than it ever gets again: its best is still after step 0.
        j["val-core/amc23/acc/mean@32"] =
            i == 2 && step == 0 ? 0.95 : 0.3 + 0.004 * step + 0.03 * std::sin(step * (i + 1.0));
        j["val-core/amc23/acc/std@32"] = 0.2;
      }
      metrics += j.dump() + "\n";
    }
    if (i == 1) {
      // A resumed run: steps 10-12 logged again after the resume; the later values count.
      metrics += nlohmann::json({{"step", 10}, {"val-core/aime24/acc/mean@32", 0.9}}).dump() + "\n";
      metrics += "{\"step\": 26, \"critic/sco";  // a run still going: torn last line
    }
    test::write_text(run / "metrics.jsonl", metrics);
    if (i == 2) test::write_text(run / "algorithm.txt", "paper semantics: the line the trainer wrote\n");
    argv.push_back(run.string());
  }
  const fs::path html = dir / "compare.html";
  argv.insert(argv.end(), {"--out", html.string(), "--markdown"});
  auto r = test::run_process(argv);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string markdown = r.out;
  // The runs table shows the trainer's own algorithm line where the run directory has one.
  EXPECT_NE(read_file(html).find("<td>paper semantics: the line the trainer wrote</td>"), std::string::npos);

  // The independent computation.
  std::vector<std::string> oracle_args = {(test::source_dir() / "tests/eval/table3_oracle.py").string()};
  for (const auto& n : names) oracle_args.push_back((dir / "runs" / n).string());
  oracle_args.insert(oracle_args.begin(), test::python().string());
  r = test::run_process(oracle_args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto oracle = nlohmann::json::parse(r.out);

  const auto layout = probe(dir.path(), html, "1280,2400");
  EXPECT_EQ(layout["resources"].get<int>(), 0);
  ASSERT_EQ(layout["legend"].size(), 3u) << layout["legend"].dump();
  // Hover over the first chart (aime24, steps 0..30 across the runs): step 15, every run's value.
  EXPECT_EQ(layout["hover"].get<std::string>().rfind("step 15:  grpo ", 0), 0u) << layout["hover"];
  EXPECT_NE(layout["hover"].get<std::string>().find("  dapo "), std::string::npos) << layout["hover"];
  EXPECT_NE(layout["hover"].get<std::string>().find("  rpg_reinforce_ufkl "), std::string::npos) << layout["hover"];
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(layout["legend"][i].get<std::string>(), names[i]);
  // Charts: the three overlaid per metric, ticks inside each box.
  ASSERT_GE(layout["charts"].size(), 5u);
  for (const auto& c : layout["charts"]) {
    EXPECT_EQ(c["series"].size(), 3u) << c["metric"];
    EXPECT_EQ(c["points"].size(), 3u) << c["metric"];
    expect_ticks_inside(c);
  }
  // Table 3: 3 runs x 2 headline metrics (std@32 is charted, not tabled) x start/last/best.
  EXPECT_EQ(layout["cells"].size(), 3u * 2u * 3u) << layout["cells"].dump();
  size_t checked = 0;
  for (const auto& cell : layout["cells"]) {
    const std::string run = cell["run"], metric = cell["metric"], col = cell["col"], text = cell["text"];
    const auto& want = oracle.at((dir / "runs" / run).string()).at(metric);
    EXPECT_NEAR(std::stod(text), want.at(col).get<double>(), 5e-5) << run << " " << metric << " " << col;
    if (col == "best") {
      EXPECT_EQ(text.substr(text.find('(')), "(" + std::to_string(want["best_step"].get<int>()) + ")") << run << " " << metric;
    }
    ++checked;
    // The same numbers in the Markdown table.
    EXPECT_NE(markdown.find(text), std::string::npos) << text << "\n" << markdown;
  }
  EXPECT_EQ(checked, 18u);
  // Every validation metric (std@32 included): last and best per run, against the oracle's --all.
  oracle_args.insert(oracle_args.begin() + 2, "--all");
  r = test::run_process(oracle_args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto all_oracle = nlohmann::json::parse(r.out);
  EXPECT_EQ(layout["all_cells"].size(), 3u * 3u * 2u) << layout["all_cells"].dump();
  size_t std_cells = 0;
  for (const auto& cell : layout["all_cells"]) {
    const std::string run = cell["run"], metric = cell["metric"], col = cell["col"], text = cell["text"];
    const auto& want = all_oracle.at((dir / "runs" / run).string()).at(metric);
    EXPECT_NEAR(std::stod(text), want.at(col).get<double>(), 5e-5) << run << " " << metric << " " << col;
    if (col == "best") {
      EXPECT_EQ(text.substr(text.find('(')), "(" + std::to_string(want["best_step"].get<int>()) + ")") << run << " " << metric;
    }
    std_cells += metric == "val-core/amc23/acc/std@32";
    EXPECT_NE(markdown.find("| " + metric + " |"), std::string::npos) << metric << "\n" << markdown;
  }
  EXPECT_EQ(std_cells, 6u);
  // The oracle and the report agree on a non-trivial case: grpo's aime24 falls after step 10.
  const auto& grpo = oracle.at((dir / "runs/grpo").string()).at("val-core/aime24/acc/mean@32");
  EXPECT_LT(grpo["last"].get<double>(), grpo["best"].get<double>());
  EXPECT_EQ(grpo["best_step"].get<int>(), 10);
  const auto& third = oracle.at((dir / "runs/rpg_reinforce_ufkl").string()).at("val-core/amc23/acc/mean@32");
  EXPECT_GT(third["best_step"].get<int>(), 0);
  EXPECT_EQ(third["start"].get<double>(), 0.95);
  const auto& resumed = oracle.at((dir / "runs/dapo").string()).at("val-core/aime24/acc/mean@32");
  EXPECT_EQ(resumed["best"].get<double>(), 0.9);  // the value logged again after the resume
  for (const auto& n : names) EXPECT_NE(markdown.find("| " + n + " |"), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("| aime24/acc/mean@32 start | aime24/acc/mean@32 last | aime24/acc/mean@32 best (step) |"),
            std::string::npos)
      << markdown;

  const fs::path shot = artifacts_dir() / "compare.png";
  fs::remove(shot);
  fs::copy_file(html, artifacts_dir() / "compare.html", fs::copy_options::overwrite_existing);
  r = chromium(dir / "home", {"--screenshot=" + shot.string(), "--window-size=1280,2400"}, "file://" + html.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(shot));
}

// Runs that cannot fill every chart still give a valid page, which says why.
TEST(ReportRender, OneStepNoValidationAndNanRunsSayWhyAChartIsMissing) {
  test::TempDir dir;
  auto make = [&](const std::string& name, const std::string& metrics) {
    fs::create_directories(dir / name);
    test::write_text(dir / name / "metrics.jsonl", metrics);
    auto r = test::run_process({test::rpg_binary().string(), "report", (dir / name).string()});
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.err;
    return probe(dir.path(), dir / name / "report.html", "1280,2000");
  };
  auto has_note = [](const nlohmann::json& layout, const std::string& text) {
    for (const auto& n : layout["notes"])
      if (n.get<std::string>().find(text) != std::string::npos) return true;
    return false;
  };
  // 1 step: validation at step 0 and one training step: nothing to draw a line through.
  auto one = make("one_step", "{\"step\": 0, \"val-core/aime24/acc/mean@4\": 0.25}\n"
                              "{\"step\": 1, \"val-core/aime24/acc/mean@4\": 0.5, \"critic/score/mean\": 0.1}\n");
  EXPECT_EQ(one["charts"].size(), 1u) << one.dump();  // validation has two steps (0 and 1)
  EXPECT_TRUE(has_note(one, "critic/score/mean: no chart: one value per run only (step 1: 0.1); a line needs two logged steps"))
      << one["notes"].dump();
  EXPECT_TRUE(has_note(one, "No step times logged")) << one["notes"].dump();
  // No validation: charts of the training metrics, and the summary says there is no held-out metric.
  auto noval = make("no_validation", "{\"step\": 1, \"actor/entropy\": 1.0}\n{\"step\": 2, \"actor/entropy\": 0.8}\n");
  EXPECT_EQ(noval["charts"].size(), 1u);
  EXPECT_TRUE(has_note(noval, "No held-out metrics: this run logged no validation")) << noval["notes"].dump();
  EXPECT_TRUE(has_note(noval, "no config.yaml in the run directory")) << noval["notes"].dump();
  // NaN values (the metrics logger writes them as null): drawn without them, and said so; a
  // metric that was never finite has no chart and says why.
  std::string nan;
  for (int step = 1; step <= 6; ++step)
    nan += nlohmann::json({{"step", step},
                           {"actor/grad_norm", step == 3 || step == 4 ? nlohmann::json() : nlohmann::json(1.0 / step)},
                           {"actor/kl_loss", nlohmann::json()}})
               .dump() + "\n";
  auto withnan = make("nan", nan);
  ASSERT_EQ(withnan["charts"].size(), 1u) << withnan.dump();
  EXPECT_EQ(withnan["charts"][0]["points"][0].get<int>(), 4);
  EXPECT_TRUE(has_note(withnan, "2 NaN/inf values not drawn (steps 3, 4)")) << withnan["notes"].dump();
  EXPECT_TRUE(has_note(withnan, "actor/kl_loss: no chart: no finite value was logged (6 NaN/inf values not drawn"))
      << withnan["notes"].dump();
  for (const auto& layout : {one, noval, withnan}) {
    EXPECT_EQ(layout["resources"].get<int>(), 0);
    for (const auto& c : layout["charts"]) expect_ticks_inside(c);
  }
}

}  // namespace
}  // namespace rpg
