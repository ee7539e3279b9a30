// `pagoda bench serve`: its statistics on timings whose answers are known, its arrival process,
// its load generator (1000 concurrent streams from one thread against a stub server), and a run
// against the real server whose token accounting must match the server's own metrics.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <array>
#include <atomic>
#include <cmath>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "apps/pagoda/bench/load_client.h"
#include "apps/pagoda/bench/serve_stats.h"
#include "server/http_server.h"
#include "support/server_process.h"
#include "support/test_data.h"

namespace pagoda::app::bench {
namespace {

using nlohmann::json;

TEST(BenchStats, PercentilesInterpolateLikeNumpy) {
  // numpy.percentile([1, 2, 3, 4], p): 50 -> 2.5, 99 -> 3.97, 0 -> 1, 100 -> 4, 25 -> 1.75.
  const std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);
  EXPECT_NEAR(percentile(v, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4);
  EXPECT_DOUBLE_EQ(percentile(v, 25), 1.75);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0);
}

// Three requests with hand-computable answers.
TEST(BenchStats, SummaryOfKnownTimings) {
  std::vector<RequestRecord> rs(4);
  // A: starts at 0, first token at 0.1, then tokens every 0.05 s; 5 output tokens, ends at 0.3.
  rs[0] = {true, "", 0.0, 0.1, 0.3, {0.05, 0.05, 0.05, 0.05}, {0.1, 0.15, 0.2, 0.25, 0.3}, 10, 5};
  // B: starts at 0.2, first token after 0.3, one token only; ends at 0.5.
  rs[1] = {true, "", 0.2, 0.3, 0.3, {}, {0.5}, 20, 1};
  // C: starts at 1.0, TTFT 0.2, 3 tokens, ends at 1.6 (latency 0.6).
  rs[2] = {true, "", 1.0, 0.2, 0.6, {0.2, 0.2}, {1.2, 1.4, 1.6}, 30, 3};
  rs[3].success = false;
  rs[3].error = "HTTP 500";
  const ServeSummary s = summarize(rs, 2.0, {50, 99}, {{"ttft", 250}});
  EXPECT_EQ(s.completed, 3);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.total_input, 60);
  EXPECT_EQ(s.total_output, 9);
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(s.output_throughput, 4.5);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, 34.5);
  EXPECT_DOUBLE_EQ(s.goodput, 1.0);  // A (100 ms) and C (200 ms) meet ttft <= 250 ms; B does not
  EXPECT_EQ(s.peak_concurrency, 2);  // A and B overlap in [0.2, 0.3]
  EXPECT_DOUBLE_EQ(s.peak_output_throughput, 6);  // second 0: A's 5 and B's 1
  const MetricStats& ttft = s.metrics.at("ttft");
  EXPECT_NEAR(ttft.mean, 200, 1e-9);
  EXPECT_NEAR(ttft.median, 200, 1e-9);
  EXPECT_NEAR(ttft.percentiles.at(99), 298, 1e-9);
  // TPOT: A (0.3 - 0.1) / 4 = 50 ms, C (0.6 - 0.2) / 2 = 200 ms; B has one token and no TPOT.
  const MetricStats& tpot = s.metrics.at("tpot");
  EXPECT_NEAR(tpot.mean, 125, 1e-9);
  EXPECT_NEAR(tpot.std, 75, 1e-9);
  // ITL: four gaps of 50 ms and two of 200 ms.
  EXPECT_NEAR(s.metrics.at("itl").mean, 100, 1e-9);
  EXPECT_NEAR(s.metrics.at("itl").median, 50, 1e-9);
  EXPECT_NEAR(s.metrics.at("e2el").mean, 400, 1e-9);
  const std::string report = format_summary(s, {"ttft", "tpot", "itl", "e2el"});
  EXPECT_NE(report.find("Successful requests:                    3"), std::string::npos) << report;
  EXPECT_NE(report.find("P99 TTFT (ms):                          298.00"), std::string::npos) << report;
  const json j = summary_json(s, rs);
  EXPECT_EQ(j["completed"], 3);
  EXPECT_EQ(j["output_lens"].size(), 4u);
  EXPECT_DOUBLE_EQ(j["p99_ttft_ms"].get<double>(), 298);
}

TEST(BenchStats, SpeculativeDecodingFromTwoMetricsReadings) {
  const std::string before =
      "# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.\n"
      "vllm:spec_decode_num_drafts_total{model_name=\"m\",engine=\"0\"} 10\n"
      "vllm:spec_decode_num_draft_tokens_total{model_name=\"m\",engine=\"0\"} 40\n"
      "vllm:spec_decode_num_accepted_tokens_total{model_name=\"m\",engine=\"0\"} 20\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",engine=\"0\",position=\"0\"} 8\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",engine=\"0\",position=\"1\"} 6\n"
      "vllm:generation_tokens_total{model_name=\"m\",engine=\"0\"} 999\n";
  std::string after = before;
  for (auto [from, to] : {std::pair{"} 10\n", "} 30\n"}, {"} 40\n", "} 120\n"}, {"} 20\n", "} 80\n"},
                          {"\"0\"} 8\n", "\"0\"} 26\n"}, {"\"1\"} 6\n", "\"1\"} 16\n"}}) {
    after.replace(after.find(from), std::string(from).size(), to);
  }
  const SpecDecodeCounters a = parse_spec_decode_counters(before), b = parse_spec_decode_counters(after);
  ASSERT_TRUE(a.present && b.present);
  EXPECT_EQ(b.drafts, 30);
  EXPECT_EQ(b.accepted_per_pos.at(1), 16);
  json j = json::object();
  const std::string report = format_spec_decode(a, b, &j);
  // 20 drafts, 80 tokens, 60 accepted: 75%, 1 + 60 / 20 = 4; positions 18 / 20 and 10 / 20.
  EXPECT_NE(report.find("Acceptance rate (%):                    75.00"), std::string::npos) << report;
  EXPECT_NE(report.find("Acceptance length:                      4.00"), std::string::npos) << report;
  EXPECT_NE(report.find("Per-position acceptance (%):            90.00, 50.00"), std::string::npos) << report;
  EXPECT_EQ(j["spec_decode_num_drafts"], 20);
  EXPECT_EQ(format_spec_decode(b, b, &j), "");  // nothing verified in between
  EXPECT_FALSE(parse_spec_decode_counters("vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 1\n").present);
}

TEST(BenchArrivals, RateBurstinessAndInfinity) {
  // Poisson at 20 requests/s: 2000 arrivals span about 100 s; in any case the count in the first
  // 50 s is within 5 standard deviations of 1000 (sd = sqrt(1000) ~ 32).
  const std::vector<double> a = arrival_times(2000, 20.0, 1.0, 7);
  ASSERT_EQ(a.size(), 2000u);
  EXPECT_EQ(a[0], 0.0);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  const auto in_50s = std::count_if(a.begin(), a.end(), [](double t) { return t < 50.0; });
  EXPECT_NEAR(static_cast<double>(in_50s), 1000.0, 160.0);
  EXPECT_NEAR(a.back(), 100.0, 10.0);
  // Burstiness: the same mean rate, gaps more (0.2) or less (5) variable than Poisson.
  auto gap_cv = [](const std::vector<double>& t) {
    double mean = t.back() / static_cast<double>(t.size() - 1), sq = 0;
    for (size_t i = 1; i < t.size(); ++i) sq += (t[i] - t[i - 1] - mean) * (t[i] - t[i - 1] - mean);
    return std::sqrt(sq / static_cast<double>(t.size() - 1)) / mean;
  };
  const auto bursty = arrival_times(2000, 20.0, 0.2, 7), smooth = arrival_times(2000, 20.0, 5.0, 7);
  EXPECT_NEAR(bursty.back(), 100.0, 25.0);
  EXPECT_NEAR(smooth.back(), 100.0, 5.0);
  EXPECT_NEAR(gap_cv(a), 1.0, 0.1);                // gamma(k): cv = 1 / sqrt(k)
  EXPECT_NEAR(gap_cv(bursty), std::sqrt(5.0), 0.4);
  EXPECT_NEAR(gap_cv(smooth), std::sqrt(0.2), 0.05);
  EXPECT_EQ(arrival_times(3, 20.0, 1.0, 7), arrival_times(3, 20.0, 1.0, 7));  // seeded
  for (double t : arrival_times(5, std::numeric_limits<double>::infinity(), 1.0, 7)) EXPECT_EQ(t, 0.0);
}

// A stub OpenAI endpoint on the server's own HTTP layer: every request streams a first chunk at
// once and the rest after a second, so that all of them are open together.
TEST(BenchLoad, OneThreadDrivesAThousandConcurrentStreams) {
  rlimit rl{};  // both ends of 1000 connections live in this process
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  ASSERT_GE(rl.rlim_cur, 2200u) << "the file descriptor limit is too low for this test";
  std::mutex mu;
  std::vector<std::shared_ptr<server::Exchange>> held;
  auto stub = server::HttpServer::start("127.0.0.1", 0, [&](server::HttpRequest&&, std::shared_ptr<server::Exchange> ex) {
    ex->begin_stream(200, "text/event-stream", {});
    ex->write("data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n");
    std::lock_guard<std::mutex> lock(mu);
    held.push_back(std::move(ex));
  });
  ASSERT_TRUE(stub.ok()) << stub.status().message();
  std::atomic<bool> stop{false};
  std::thread finisher([&] {  // ends the held streams one second after they arrived
    while (!stop) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
      std::vector<std::shared_ptr<server::Exchange>> batch;
      {
        std::lock_guard<std::mutex> lock(mu);
        batch.swap(held);
      }
      for (auto& ex : batch) {
        ex->write("data: {\"choices\":[{\"index\":0,\"text\":\"b\"}]}\n\n");
        ex->write("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n");
        ex->write("data: [DONE]\n\n");
        ex->end();
      }
    }
  });
  Target t;
  t.port = (*stub)->port();
  const int n = 1000;
  std::vector<std::string> bodies(n, R"({"prompt": "x", "stream": true})");
  double duration = 0;
  const auto records = run_load(t, bodies, std::vector<double>(n, 0.0), {}, &duration);
  stop = true;
  finisher.join();
  const ServeSummary s = summarize(records, duration, {99}, {});
  EXPECT_EQ(s.completed, n) << (records.empty() ? "" : records[0].error);
  EXPECT_EQ(s.peak_concurrency, n);  // all open at once, from one client thread
  EXPECT_EQ(s.total_output, 2 * n);
  EXPECT_EQ(s.total_input, 3 * n);
  EXPECT_GE(s.metrics.at("itl").median, 100.0);  // the second chunk came about a second later
  EXPECT_LT(duration, 10.0);
}

// Runs a shell command; its exit status (-1 when it did not exit), its output into *out.
int run_command(const std::string& cmd, std::string* out) {
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return -1;
  std::array<char, 4096> buf;
  size_t got;
  while ((got = fread(buf.data(), 1, buf.size(), pipe)) > 0) out->append(buf.data(), got);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Against the real server: every request succeeds, and the output tokens the client counts (from
// each response's usage) are exactly what the server's vllm:generation_tokens counter added.
TEST(BenchServe, AccountingMatchesTheServersMetrics) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  testing::ServerProcess server(PAGODA_BINARY, {model, "--served-model-name", "stories", "--disable-log-requests",
                                                "--disable-log-stats"});
  ASSERT_NE(server.port(), 0);
  auto generated = [&] {
    testing::HttpResult m = testing::http_request(server.port(), "GET", "/metrics");
    const std::string key = "vllm:generation_tokens_total{model_name=\"stories\",engine=\"0\"} ";
    const size_t at = m.body.find(key);
    return at == std::string::npos ? -1.0 : std::stod(m.body.substr(at + key.size()));
  };
  const double before = generated();
  const std::string result = pagoda::testing::make_temp_dir() + "/bench_serve_result.json";
  const std::string cmd = std::string(PAGODA_BINARY) + " bench serve --base-url http://127.0.0.1:" +
                          std::to_string(server.port()) +
                          " --num-prompts 40 --random-input-len 24 --random-output-len 12 --random-range-ratio 0.5"
                          " --request-rate 200 --max-concurrency 8 --disable-progress --save-result " +
                          result + " 2>&1";
  std::string out;
  ASSERT_EQ(run_command(cmd, &out), 0) << out;
  EXPECT_NE(out.find("Successful requests:                    40"), std::string::npos) << out;
  std::ifstream in(result);
  const json j = json::parse(in);
  EXPECT_EQ(j["completed"], 40);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_LE(j["max_concurrent_requests"].get<int64_t>(), 8);
  int64_t output = 0;
  for (const json& len : j["output_lens"]) {
    EXPECT_GE(len.get<int64_t>(), 1);
    output += len.get<int64_t>();
  }
  EXPECT_EQ(output, j["total_output_tokens"].get<int64_t>());
  EXPECT_EQ(static_cast<double>(output), generated() - before);
  // Prompt lengths are exact (ids sent as they are): 24 +- 50%.
  for (const json& len : j["input_lens"]) {
    EXPECT_GE(len.get<int64_t>(), 12);
    EXPECT_LE(len.get<int64_t>(), 36);
  }

  // A prompt file: each line's output_len (or --random-output-len), exactly, with EOS ignored.
  const std::string prompts = pagoda::testing::make_temp_dir() + "/bench_prompts.jsonl";
  std::ofstream(prompts) << "{\"prompt\": \"Once upon a time\", \"output_len\": 5}\n\n"
                         << "{\"prompt\": \"The cat\"}\n{\"prompt\": \"Lily\", \"output_len\": 2}\n";
  const std::string file_cmd = std::string(PAGODA_BINARY) + " bench serve --base-url http://127.0.0.1:" +
                               std::to_string(server.port()) + " --dataset-name jsonl --dataset-path " + prompts +
                               " --random-output-len 3 --ignore-eos --disable-progress --save-result " + result +
                               " > /dev/null 2>&1";
  ASSERT_EQ(std::system(file_cmd.c_str()), 0);
  std::ifstream file_result(result);
  const json fj = json::parse(file_result);
  EXPECT_EQ(fj["completed"], 3);
  EXPECT_EQ(fj["output_lens"], json::array({5, 3, 2}));
}

// A server that speculates: bench serve reports what its counters added during the run.
TEST(BenchServe, ReportsTheServersSpeculativeDecoding) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  testing::ServerProcess server(PAGODA_BINARY, {model, "--served-model-name", "stories", "--disable-log-requests",
                                                "--disable-log-stats", "--speculative-config",
                                                R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1})"});
  ASSERT_NE(server.port(), 0);
  const auto counters = [&] {
    return parse_spec_decode_counters(testing::http_request(server.port(), "GET", "/metrics").body);
  };
  const SpecDecodeCounters before = counters();
  ASSERT_TRUE(before.present);
  const std::string result = pagoda::testing::make_temp_dir() + "/bench_serve_spec.json";
  const std::string cmd = std::string(PAGODA_BINARY) + " bench serve --base-url http://127.0.0.1:" +
                          std::to_string(server.port()) +
                          " --num-prompts 8 --random-input-len 24 --random-output-len 40 --ignore-eos"
                          " --max-concurrency 4 --disable-progress --save-result " + result + " 2>&1";
  std::string out;
  ASSERT_EQ(run_command(cmd, &out), 0) << out;
  EXPECT_NE(out.find("Acceptance rate (%):"), std::string::npos) << out;
  const SpecDecodeCounters after = counters();
  std::ifstream in(result);
  const json j = json::parse(in);
  EXPECT_GT(after.drafts, before.drafts);
  EXPECT_EQ(j["spec_decode_num_drafts"].get<double>(), after.drafts - before.drafts);
  EXPECT_EQ(j["spec_decode_accepted_tokens"].get<double>(), after.accepted_tokens - before.accepted_tokens);
}

}  // namespace
}  // namespace pagoda::app::bench
