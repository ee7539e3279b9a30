// `pagoda bench sweep`: the tuning loop operators run by hand. It runs `bench throughput` or
// `bench serve` once per point of a grid of one or two parameters, each run a child process of
// this same binary (a fresh engine per point; for `serve`, the server is restarted only when an
// engine flag changes), then writes a CSV and an SVG chart (output throughput and a P99 latency
// against the swept value) and names the best point under a latency goal.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "apps/pagoda/commands.h"

namespace pagoda::app {

namespace {

using nlohmann::json;

std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::string self_binary() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("pagoda");
}

// Starts `args` (argv[0] included) as a child whose stdout and stderr are appended to `log`.
pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (FILE* f = std::fopen(log.c_str(), "a")) {
      dup2(fileno(f), 1);
      dup2(fileno(f), 2);
    }
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// Runs `args` to completion (output to `log`); returns its exit status.
int run_child(const std::vector<std::string>& args, const std::string& log) {
  int status = 0;
  waitpid(spawn(args, log), &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A `pagoda serve` child on a free port, up until stopped.
class ServerChild {
 public:
  Status start(const std::vector<std::string>& args, const std::string& log) {
    std::remove(log.c_str());
    pid_ = spawn(args, log);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(10);
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream in(log);
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const std::string key = "ready: http://";
      if (const size_t at = text.find(key); at != std::string::npos) {
        url_ = "http://" + text.substr(at + key.size(), text.find("/v1", at) - at - key.size());
        return Status::ok_status();
      }
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return unavailable("the server did not start; see " + log);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return unavailable("the server did not become ready in 10 minutes; see " + log);
  }
  void stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int status;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  ~ServerChild() { stop(); }
  const std::string& url() const { return url_; }

 private:
  pid_t pid_ = -1;
  std::string url_;
};

struct Param {
  std::string name;                 // a flag without its dashes, e.g. max-num-seqs
  std::vector<std::string> values;
};

// Flags of `bench serve` itself; anything else swept in serve mode is an engine flag.
bool is_bench_serve_flag(const std::string& name) {
  static const char* kFlags[] = {"request-rate", "max-concurrency", "burstiness", "num-prompts", "random-input-len",
                                 "random-output-len", "random-range-ratio", "random-prefix-len", "endpoint"};
  return std::find(std::begin(kFlags), std::end(kFlags), name) != std::end(kFlags);
}

double number(const std::string& s) {
  if (s == "inf") return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  return *end == '\0' ? v : std::nan("");
}

std::string escape_xml(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

// A line chart: the swept points along x (evenly, labelled), output throughput on the left axis
// and the latency metric (if any) on the right axis.
std::string svg_chart(const std::vector<std::string>& labels, const std::vector<double>& throughput,
                      const std::vector<double>& latency, const std::string& x_title, const std::string& latency_title) {
  const double w = 720, h = 420, left = 80, right = 80, top = 40, bottom = 70;
  const double pw = w - left - right, ph = h - top - bottom;
  auto max_of = [](const std::vector<double>& v) {
    double m = 0;
    for (double x : v) {
      if (std::isfinite(x)) m = std::max(m, x);
    }
    return m > 0 ? m * 1.1 : 1.0;
  };
  const double tmax = max_of(throughput), lmax = max_of(latency);
  const size_t n = labels.size();
  auto x_at = [&](size_t i) { return left + (n > 1 ? pw * static_cast<double>(i) / static_cast<double>(n - 1) : pw / 2); };
  auto series = [&](const std::vector<double>& v, double vmax, const char* color) {
    std::string pts, dots;
    for (size_t i = 0; i < v.size(); ++i) {
      if (!std::isfinite(v[i])) continue;
      const double x = x_at(i), y = top + ph * (1 - v[i] / vmax);
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", x, y);
      pts += buf;
      std::snprintf(buf, sizeof buf, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/>", x, y, color);
      dots += buf;
    }
    return "<polyline fill=\"none\" stroke=\"" + std::string(color) + "\" stroke-width=\"2\" points=\"" + pts + "\"/>" +
           dots + "\n";
  };
  char buf[512];
  std::string out;
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
                "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                w, h);
  out += buf;
  std::snprintf(buf, sizeof buf,
                "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#888\"/>\n", left, top,
                pw, ph);
  out += buf;
  for (int k = 0; k <= 4; ++k) {
    const double y = top + ph * (1 - k / 4.0);
    std::snprintf(buf, sizeof buf,
                  "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\" fill=\"#1f77b4\">%.3g</text>\n", left - 6, y + 4,
                  tmax * k / 4.0);
    out += buf;
    if (!latency.empty()) {
      std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"%.0f\" fill=\"#d62728\">%.3g</text>\n", left + pw + 6, y + 4,
                    lmax * k / 4.0);
      out += buf;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">", x_at(i), top + ph + 18);
    out += buf + escape_xml(labels[i]) + "</text>\n";
  }
  std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">", left + pw / 2, h - 20);
  out += buf + escape_xml(x_title) + "</text>\n";
  std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"%.0f\" fill=\"#1f77b4\">output tokens/s</text>\n", left, top - 12);
  out += buf;
  if (!latency.empty()) {
    std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\" fill=\"#d62728\">", left + pw,
                  top - 12);
    out += buf + escape_xml(latency_title) + "</text>\n";
  }
  out += series(throughput, tmax, "#1f77b4");
  if (!latency.empty()) out += series(latency, lmax, "#d62728");
  out += "</svg>\n";
  return out;
}

}  // namespace

void BenchSweepFlags::add_to(CLI::App& cmd) {
  cmd.add_option("--mode", mode, "throughput (in-process) or serve (a server per engine setting)")
      ->capture_default_str();
  cmd.add_option("--param", params,
                 "NAME=V1,V2,... : a flag to sweep (one or two --param), e.g. max-num-seqs=1,4,16 or "
                 "request-rate=1,2,inf")
      ->required();
  cmd.add_option("--model-args", model_args,
                 "model and engine flags for every point, space-separated (e.g. \"--model m.gguf --block-size 16\")");
  cmd.add_option("--bench-args", bench_args, "flags of bench throughput / bench serve for every point");
  cmd.add_option("--latency-goal", latency_goal,
                 "serve mode: METRIC:MS the best point must meet, METRIC one of p99_ttft, p99_tpot, p99_itl, p99_e2el")
      ->capture_default_str();
  cmd.add_option("--output-csv", output_csv, "the results, one row per point")->capture_default_str();
  cmd.add_option("--output-svg", output_svg, "a chart of throughput and latency against the swept value")
      ->capture_default_str();
  cmd.add_option("--work-dir", work_dir, "where each point's logs and JSON go")->capture_default_str();
}

int run_bench_sweep(const BenchSweepFlags& f) {
  if (f.mode != "throughput" && f.mode != "serve") return fail(invalid_argument("--mode must be throughput or serve"));
  if (f.params.empty() || f.params.size() > 2) return fail(invalid_argument("give one or two --param NAME=V1,V2,..."));
  std::vector<Param> params;
  for (const std::string& p : f.params) {
    const size_t eq = p.find('=');
    Param param;
    param.name = p.substr(0, eq);
    while (!param.name.empty() && param.name[0] == '-') param.name.erase(0, 1);
    if (eq == std::string::npos || param.name.empty()) return fail(invalid_argument("--param takes NAME=V1,V2,..., got '" + p + "'"));
    std::istringstream in(p.substr(eq + 1));
    for (std::string v; std::getline(in, v, ',');) {
      if (!v.empty()) param.values.push_back(v);
    }
    if (param.values.empty()) return fail(invalid_argument("--param " + param.name + " has no values"));
    params.push_back(std::move(param));
  }
  std::string goal_metric;
  double goal_ms = 0;
  if (!f.latency_goal.empty()) {
    const size_t colon = f.latency_goal.find(':');
    goal_metric = f.latency_goal.substr(0, colon);
    goal_ms = colon == std::string::npos ? -1 : number(f.latency_goal.substr(colon + 1));
    if (goal_metric != "p99_ttft" && goal_metric != "p99_tpot" && goal_metric != "p99_itl" && goal_metric != "p99_e2el") {
      return fail(invalid_argument("--latency-goal METRIC must be p99_ttft, p99_tpot, p99_itl or p99_e2el"));
    }
    if (!(goal_ms > 0)) return fail(invalid_argument("--latency-goal needs a positive number of ms"));
  }
  const std::string bin = self_binary();
  const std::vector<std::string> model_args = words(f.model_args), bench_args = words(f.bench_args);
  if (mkdir(f.work_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return fail(Status(StatusCode::kIoError, f.work_dir + ": cannot create"));
  }

  // The grid, first parameter outermost.
  std::vector<std::vector<std::string>> grid;
  for (const std::string& a : params[0].values) {
    if (params.size() == 1) {
      grid.push_back({a});
    } else {
      for (const std::string& b : params[1].values) grid.push_back({a, b});
    }
  }
  struct Row {
    std::vector<std::string> values;
    json result;
    bool ok = false;
  };
  std::vector<Row> rows;
  ServerChild server;
  std::string server_key;  // the engine settings the running server has
  for (size_t i = 0; i < grid.size(); ++i) {
    Row row;
    row.values = grid[i];
    const std::string tag = f.work_dir + "/point" + std::to_string(i);
    const std::string result = tag + ".json";
    std::vector<std::string> engine_flags, bench_flags;
    for (size_t k = 0; k < params.size(); ++k) {
      auto& dst = f.mode == "serve" && is_bench_serve_flag(params[k].name) ? bench_flags : engine_flags;
      dst.push_back("--" + params[k].name);
      dst.push_back(grid[i][k]);
    }
    std::fprintf(stderr, "point %zu/%zu:", i + 1, grid.size());
    for (size_t k = 0; k < params.size(); ++k) std::fprintf(stderr, " %s=%s", params[k].name.c_str(), grid[i][k].c_str());
    std::fprintf(stderr, "\n");
    int rc = 0;
    if (f.mode == "throughput") {
      std::vector<std::string> args = {bin, "bench", "throughput"};
      args.insert(args.end(), model_args.begin(), model_args.end());
      args.insert(args.end(), bench_args.begin(), bench_args.end());
      args.insert(args.end(), engine_flags.begin(), engine_flags.end());
      args.insert(args.end(), {"--output-json", result});
      rc = run_child(args, tag + ".log");
    } else {
      std::string key;
      for (const auto& e : engine_flags) key += e + " ";
      if (key != server_key || server.url().empty()) {
        server.stop();
        std::vector<std::string> args = {bin, "serve"};
        args.insert(args.end(), model_args.begin(), model_args.end());
        args.insert(args.end(), engine_flags.begin(), engine_flags.end());
        args.insert(args.end(), {"--port", "0", "--disable-log-requests", "--disable-log-stats"});
        if (Status st = server.start(args, tag + ".server.log"); !st.ok()) return fail(st);
        server_key = key;
      }
      std::vector<std::string> args = {bin, "bench", "serve", "--base-url", server.url(), "--disable-progress"};
      args.insert(args.end(), bench_args.begin(), bench_args.end());
      args.insert(args.end(), bench_flags.begin(), bench_flags.end());
      args.insert(args.end(), {"--save-result", result});
      rc = run_child(args, tag + ".log");
    }
    std::ifstream in(result);
    if (rc == 0 && in) {
      row.result = json::parse(in, nullptr, false);
      row.ok = !row.result.is_discarded();
    }
    if (!row.ok) std::fprintf(stderr, "  failed (exit %d); see %s.log\n", rc, tag.c_str());
    rows.push_back(std::move(row));
  }
  server.stop();

  // The columns both modes report, then serve's latency figures.
  const bool serve = f.mode == "serve";
  const std::vector<std::pair<std::string, std::string>> columns =
      serve ? std::vector<std::pair<std::string, std::string>>{{"request_throughput", "request_throughput"},
                                                                {"output_throughput", "output_throughput"},
                                                                {"mean_ttft_ms", "mean_ttft_ms"},
                                                                {"p99_ttft_ms", "p99_ttft_ms"},
                                                                {"mean_tpot_ms", "mean_tpot_ms"},
                                                                {"p99_tpot_ms", "p99_tpot_ms"},
                                                                {"p99_itl_ms", "p99_itl_ms"},
                                                                {"p99_e2el_ms", "p99_e2el_ms"},
                                                                {"failed", "failed"}}
            : std::vector<std::pair<std::string, std::string>>{{"request_throughput", "requests_per_second"},
                                                                {"output_throughput", "output_tokens_per_second"},
                                                                {"total_token_throughput", "tokens_per_second"}};
  auto value = [](const Row& r, const std::string& key) {
    return r.ok && r.result.contains(key) && r.result[key].is_number() ? r.result[key].get<double>() : std::nan("");
  };
  std::ofstream csv(f.output_csv);
  for (const Param& p : params) csv << p.name << ",";
  for (size_t c = 0; c < columns.size(); ++c) csv << columns[c].first << (c + 1 < columns.size() ? "," : "\n");
  for (const Row& r : rows) {
    for (const std::string& v : r.values) csv << v << ",";
    for (size_t c = 0; c < columns.size(); ++c) {
      const double v = value(r, columns[c].second);
      if (std::isfinite(v)) csv << v;
      csv << (c + 1 < columns.size() ? "," : "\n");
    }
  }
  if (!csv) return fail(Status(StatusCode::kIoError, f.output_csv + ": cannot write"));

  // The chart follows the first parameter (at the second's first value, with two).
  std::vector<std::string> labels;
  std::vector<double> tput, lat;
  const std::string lat_key = serve ? (goal_metric.empty() ? "p99_e2el" : goal_metric) + "_ms" : "";
  for (const Row& r : rows) {
    if (params.size() == 2 && r.values[1] != params[1].values[0]) continue;
    labels.push_back(r.values[0]);
    tput.push_back(value(r, serve ? "output_throughput" : "output_tokens_per_second"));
    if (serve) lat.push_back(value(r, lat_key));
  }
  std::string x_title = params[0].name;
  if (params.size() == 2) x_title += " (" + params[1].name + "=" + params[1].values[0] + ")";
  std::ofstream(f.output_svg) << svg_chart(labels, tput, lat, x_title, lat_key);

  // The best point: the most output throughput among those meeting the goal.
  const Row* best = nullptr;
  for (const Row& r : rows) {
    const double t = value(r, serve ? "output_throughput" : "output_tokens_per_second");
    if (!std::isfinite(t)) continue;
    if (!goal_metric.empty()) {
      const double l = value(r, goal_metric + "_ms");
      if (!(l <= goal_ms)) continue;
    }
    if (!best || t > value(*best, serve ? "output_throughput" : "output_tokens_per_second")) best = &r;
  }
  std::printf("%zu points; results in %s, chart in %s\n", rows.size(), f.output_csv.c_str(), f.output_svg.c_str());
  if (best) {
    std::printf("best:");
    for (size_t k = 0; k < params.size(); ++k) std::printf(" %s=%s", params[k].name.c_str(), best->values[k].c_str());
    std::printf(" (%.2f output tokens/s%s)\n", value(*best, serve ? "output_throughput" : "output_tokens_per_second"),
                goal_metric.empty() ? "" : (", " + goal_metric + " within " + f.latency_goal.substr(f.latency_goal.find(':') + 1) + " ms").c_str());
  } else {
    std::printf("best: none%s\n", goal_metric.empty() ? " (every point failed)" : " meets the latency goal");
  }
  const bool all_ok = std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.ok; });
  return all_ok ? 0 : 1;
}

}  // namespace pagoda::app
