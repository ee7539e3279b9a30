// The OpenAI-compatible server as its clients meet it: the real `pagoda serve` binary on a free
// loopback port, driven over HTTP. stories260K (a real trained model) gives outputs checkable
// against its golden greedy text; a dummy llama-110m (slow on a CPU) gives requests that stay in
// flight long enough for disconnect, overload and shutdown tests.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "support/free_ports.h"
#include "support/server_process.h"
#include "support/test_data.h"

namespace pagoda {
namespace {

using nlohmann::json;
using testing::HttpResult;
using testing::ServerProcess;
using testing::SseClient;
using Clock = std::chrono::steady_clock;

// A tiny chat template in the ChatML style (stories260K ships none).
const char* kChatTemplate =
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}";

std::vector<std::string> stories_args(const std::string& model, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {model, "--served-model-name", "stories", "--chat-template", kChatTemplate,
                                   "--disable-log-stats"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// A model slow enough on a CPU that requests stay in flight for seconds, with a tokenizer that
// covers its 32000-token vocabulary (so every sampled token shows as text in the stream).
std::vector<std::string> slow_args(const std::string& tokenizer, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"llama-110m", "--load-format", "dummy", "--tokenizer", tokenizer,
                                   "--served-model-name", "slow", "--disable-log-stats",
                                   "--kv-cache-memory", "256MiB", "--max-model-len", "1024"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

json post(uint16_t port, const std::string& path, const json& body, int* status = nullptr,
          const testing::Headers& headers = {}) {
  HttpResult r = testing::http_request(port, "POST", path, body.dump(), headers);
  if (status) *status = r.status;
  json j = json::parse(r.body, nullptr, false);
  if (j.is_discarded()) ADD_FAILURE() << "not JSON (" << r.status << "): " << r.body;
  return j;
}

std::string golden_text() {
  std::string path = testing::find_test_file("stories260K/greedy-bos-256.txt");
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

// The value of one Prometheus series (exact name with labels), or -1.
double metric(const std::string& exposition, const std::string& series) {
  size_t at = 0;
  while ((at = exposition.find(series + " ", at)) != std::string::npos) {
    if (at == 0 || exposition[at - 1] == '\n') return std::stod(exposition.substr(at + series.size() + 1));
    at += series.size();
  }
  return -1;
}

// Polls /health every 100 ms until its status is (or, with changes_from, stops being) `status`,
// or the deadline passes; returns the last answer.
HttpResult poll_health(uint16_t port, Clock::time_point deadline, int status, bool changes_from = false) {
  HttpResult health;
  while (Clock::now() < deadline) {
    health = testing::http_request(port, "GET", "/health");
    if ((health.status == status) != changes_from) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return health;
}

// Waits until the engine is idle: nothing running or waiting and no KV blocks in use.
bool wait_idle(uint16_t port, const std::string& model, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const auto deadline = Clock::now() + timeout;
  const std::string label = "{model_name=\"" + model + "\",engine=\"0\"}";
  while (Clock::now() < deadline) {
    HttpResult r = testing::http_request(port, "GET", "/metrics");
    if (metric(r.body, "vllm:num_requests_running" + label) == 0 &&
        metric(r.body, "vllm:num_requests_waiting" + label) == 0 &&
        metric(r.body, "vllm:kv_cache_usage_perc" + label) == 0) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

void expect_error(const json& j, const std::string& type) {
  ASSERT_TRUE(j.contains("error")) << j.dump();
  const json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << j.dump();
  EXPECT_EQ(e["type"], type) << j.dump();
  EXPECT_TRUE(e.contains("param")) << j.dump();
  EXPECT_TRUE(e.contains("code")) << j.dump();
}

#define START_STORIES(server, ...)                                         \
  PAGODA_TEST_FILE(model_path, "stories260K/stories260K.gguf");            \
  ServerProcess server(PAGODA_BINARY, stories_args(model_path, ##__VA_ARGS__)); \
  ASSERT_NE(server.port(), 0);                                             \
  const uint16_t port = server.port()

TEST(Server, HealthVersionModels) {
  START_STORIES(server, {"--served-model-name", "alias"});
  EXPECT_EQ(testing::http_request(port, "GET", "/health").status, 200);
  HttpResult v = testing::http_request(port, "GET", "/version");
  EXPECT_EQ(v.status, 200);
  EXPECT_TRUE(json::parse(v.body)["version"].is_string()) << v.body;
  HttpResult m = testing::http_request(port, "GET", "/v1/models");
  ASSERT_EQ(m.status, 200);
  json models = json::parse(m.body);
  EXPECT_EQ(models["object"], "list");
  ASSERT_EQ(models["data"].size(), 2u);
  EXPECT_EQ(models["data"][0]["id"], "stories");
  EXPECT_EQ(models["data"][1]["id"], "alias");
  EXPECT_EQ(models["data"][0]["object"], "model");
  EXPECT_EQ(models["data"][0]["max_model_len"], 2048);
  EXPECT_EQ(m.headers["content-type"], "application/json");
  // Either name serves the model; the response names the one asked for.
  int status = 0;
  json r = post(port, "/v1/completions", {{"model", "alias"}, {"prompt", "Hi"}, {"max_tokens", 2}}, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(r["model"], "alias");
}

TEST(Server, GreedyCompletionMatchesGoldenText) {
  START_STORIES(server);
  int status = 0;
  json r = post(port, "/v1/completions", {{"model", "stories"}, {"prompt", {1}}, {"max_tokens", 256}, {"temperature", 0}},
                &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "stories");
  EXPECT_EQ(r["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_TRUE(r["created"].is_number_integer());
  ASSERT_EQ(r["choices"].size(), 1u);
  EXPECT_EQ(r["choices"][0]["index"], 0);
  EXPECT_EQ(r["choices"][0]["text"], golden_text());
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(r["usage"]["prompt_tokens"], 1);
  EXPECT_EQ(r["usage"]["completion_tokens"], 256);
  EXPECT_EQ(r["usage"]["total_tokens"], 257);

  // From the golden run's own first two tokens ("Once upon"), greedy goes on the same way, and
  // the text continues the prompt's: it starts with the space before "a" (as decode(prompt +
  // output) - decode(prompt) does, and vLLM returns it).
  json cont = post(port, "/v1/completions", {{"prompt", "Once upon"}, {"max_tokens", 254}, {"temperature", 0}}, &status);
  ASSERT_EQ(status, 200) << cont.dump();
  EXPECT_EQ(cont["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(cont["choices"][0]["text"], golden_text().substr(std::string("Once upon").size()));
}

// Streaming carries the same text as the whole response, in the OpenAI chunk shape, ending
// with a usage chunk (when asked) and [DONE].
TEST(Server, StreamingEqualsNonStreaming) {
  START_STORIES(server);
  json req = {{"prompt", "Once upon a time"}, {"max_tokens", 60}, {"temperature", 0}};
  int status = 0;
  json whole = post(port, "/v1/completions", req, &status);
  ASSERT_EQ(status, 200) << whole.dump();

  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  SseClient sse(port, "/v1/completions", req.dump());
  ASSERT_EQ(sse.status(), 200);
  std::vector<std::string> events = sse.rest();
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string id;
  std::string finish;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "text_completion");
    if (id.empty()) id = c["id"];
    EXPECT_EQ(c["id"], id);
    EXPECT_TRUE(c["usage"].is_null()) << events[i];
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, whole["choices"][0]["text"]);
  EXPECT_EQ(finish, whole["choices"][0]["finish_reason"]);
  json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"], whole["usage"]);
}

TEST(Server, SeededSamplingWithNAndLogprobs) {
  START_STORIES(server);
  json req = {{"prompt", "The dog"}, {"max_tokens", 12}, {"temperature", 1.0}, {"seed", 42},
              {"n", 3}, {"logprobs", 2}, {"ignore_eos", true}};
  int status = 0;
  json a = post(port, "/v1/completions", req, &status);
  ASSERT_EQ(status, 200) << a.dump();
  json b = post(port, "/v1/completions", req);
  ASSERT_EQ(a["choices"].size(), 3u);
  EXPECT_EQ(a["choices"], b["choices"]);  // same seed, same output
  std::set<std::string> texts;
  for (int i = 0; i < 3; ++i) {
    const json& c = a["choices"][i];
    EXPECT_EQ(c["index"], i);
    EXPECT_EQ(c["finish_reason"], "length");
    texts.insert(c["text"].get<std::string>());
    const json& lp = c["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), 12u) << lp.dump();
    ASSERT_EQ(lp["token_logprobs"].size(), 12u);
    ASSERT_EQ(lp["top_logprobs"].size(), 12u);
    ASSERT_EQ(lp["text_offset"].size(), 12u);
    std::string joined;
    for (size_t t = 0; t < 12; ++t) {
      EXPECT_LE(lp["token_logprobs"][t].get<double>(), 0.0);
      // The top 2, plus the sampled token when it is not among them (as vLLM returns them).
      EXPECT_LE(lp["top_logprobs"][t].size(), 3u);
      EXPECT_GE(lp["top_logprobs"][t].size(), 2u);
      EXPECT_TRUE(lp["top_logprobs"][t].contains(lp["tokens"][t].get<std::string>())) << lp["top_logprobs"][t].dump();
      EXPECT_EQ(lp["text_offset"][t].get<size_t>(), joined.size());
      joined += lp["tokens"][t].get<std::string>();
    }
  }
  EXPECT_GT(texts.size(), 1u);  // three samples at temperature 1 are not all the same
  EXPECT_EQ(a["usage"]["completion_tokens"], 36);
}

TEST(Server, StopStringAndEchoAndPromptList) {
  START_STORIES(server);
  const std::string golden = golden_text();  // "Once upon a time, there was a little girl named Lily. ..."
  int status = 0;
  json r = post(port, "/v1/completions", {{"prompt", {1}}, {"max_tokens", 100}, {"temperature", 0}, {"stop", {"little"}}},
                &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["text"], golden.substr(0, golden.find("little")));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["choices"][0]["stop_reason"], "little");

  json two = post(port, "/v1/completions",
                  {{"prompt", {"Once upon", "The cat"}}, {"max_tokens", 5}, {"temperature", 0}, {"echo", true}}, &status);
  ASSERT_EQ(status, 200) << two.dump();
  ASSERT_EQ(two["choices"].size(), 2u);
  EXPECT_EQ(two["choices"][0]["text"].get<std::string>().rfind("Once upon", 0), 0u) << two.dump();
  EXPECT_EQ(two["choices"][1]["text"].get<std::string>().rfind("The cat", 0), 0u) << two.dump();
  EXPECT_EQ(two["usage"]["completion_tokens"], 10);
}

TEST(Server, ChatCompletionStreamingAndTokenize) {
  START_STORIES(server);
  json messages = json::array({{{"role", "system"}, {"content", "Tell a story."}}, {{"role", "user"}, {"content", "A cat"}}});
  int status = 0;
  json tok = post(port, "/tokenize", {{"messages", messages}}, &status);
  ASSERT_EQ(status, 200) << tok.dump();
  ASSERT_TRUE(tok["count"].is_number_integer());

  json req = {{"model", "stories"}, {"messages", messages}, {"max_completion_tokens", 30}, {"temperature", 0}};
  json r = post(port, "/v1/chat/completions", req, &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["usage"]["prompt_tokens"], tok["count"]);
  const std::string content = r["choices"][0]["message"]["content"];

  req["stream"] = true;
  SseClient sse(port, "/v1/chat/completions", req.dump());
  ASSERT_EQ(sse.status(), 200);
  std::vector<std::string> events = sse.rest();
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string streamed;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json c = json::parse(events[i]);
    const json& d = c["choices"][0]["delta"];
    if (d.contains("content") && d["content"].is_string()) streamed += d["content"].get<std::string>();
  }
  EXPECT_EQ(streamed, content);

  // Special-token text written in a message is plain text: "<s></s>" yields neither BOS (1) nor
  // EOS (2), although the same text in a raw completions prompt is read as those tokens.
  json forged = post(port, "/tokenize", {{"messages", {{{"role", "user"}, {"content", "<s></s>"}}}}}, &status);
  ASSERT_EQ(status, 200) << forged.dump();
  for (const json& id : forged["tokens"]) EXPECT_TRUE(id != 1 && id != 2) << forged.dump();
  json raw = post(port, "/tokenize", {{"prompt", "<s></s>"}, {"add_special_tokens", false}}, &status);
  EXPECT_EQ(raw["tokens"], json::array({1, 2})) << raw.dump();

  json back = post(port, "/detokenize", {{"tokens", tok["tokens"]}}, &status);
  ASSERT_EQ(status, 200) << back.dump();
  EXPECT_NE(back["prompt"].get<std::string>().find("user: A cat"), std::string::npos) << back.dump();
}

TEST(Server, MetricsUseVllmNames) {
  START_STORIES(server);
  int status = 0;
  post(port, "/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 5}, {"temperature", 0}, {"ignore_eos", true}}, &status);
  ASSERT_EQ(status, 200);
  HttpResult m = testing::http_request(port, "GET", "/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_NE(m.headers["content-type"].find("text/plain"), std::string::npos);
  const std::string& t = m.body;
  EXPECT_EQ(metric(t, "vllm:request_success_total{model_name=\"stories\",engine=\"0\",finished_reason=\"length\"}"), 1) << t;
  EXPECT_EQ(metric(t, "vllm:generation_tokens_total{model_name=\"stories\",engine=\"0\"}"), 5);
  EXPECT_GE(metric(t, "vllm:prompt_tokens_total{model_name=\"stories\",engine=\"0\"}"), 2);
  EXPECT_EQ(metric(t, "vllm:num_requests_running{model_name=\"stories\",engine=\"0\"}"), 0);
  EXPECT_EQ(metric(t, "vllm:time_to_first_token_seconds_count{model_name=\"stories\",engine=\"0\"}"), 1);
  EXPECT_EQ(metric(t, "vllm:inter_token_latency_seconds_count{model_name=\"stories\",engine=\"0\"}"), 4);
  EXPECT_EQ(metric(t, "vllm:e2e_request_latency_seconds_count{model_name=\"stories\",engine=\"0\"}"), 1);
  for (const char* name : {"vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                           "vllm:num_preemptions_total", "vllm:num_requests_waiting", "vllm:iteration_tokens_total_bucket",
                           "vllm:request_queue_time_seconds_bucket", "vllm:request_prompt_tokens_bucket",
                           "vllm:request_generation_tokens_bucket", "vllm:cache_config_info", "process_resident_memory_bytes",
                           "process_cpu_seconds_total", "process_open_fds"}) {
    EXPECT_NE(t.find(name), std::string::npos) << name;
  }
}

// With the host tier (--kv-offloading-size) a prompt whose blocks a small KV cache evicted comes
// back from the tier with the same text, and the vllm:kv_offload_* series say so.
TEST(Server, KvOffloadingServesEvictedPrefixesAndExportsItsMetrics) {
  // 24 blocks of 16 tokens of stories260K's 1,280-byte tokens: three 150-token prompts do not fit.
  START_STORIES(server, {"--kv-offloading-size", "0.01", "--kv-cache-memory-bytes", "491520", "--max-model-len", "192"});
  auto prompt = [](int seed) {
    json ids = json::array();
    for (int i = 0; i < 150; ++i) ids.push_back(10 + (seed * 7919 + i * 104729) % 400);
    return ids;
  };
  auto complete = [&](int seed) {
    int status = 0;
    json r = post(port, "/v1/completions", {{"prompt", prompt(seed)}, {"max_tokens", 8}, {"temperature", 0}}, &status);
    EXPECT_EQ(status, 200) << r.dump();
    return r["choices"][0]["text"].get<std::string>();
  };
  const std::string first = complete(1);
  complete(2);
  complete(3);
  EXPECT_EQ(complete(1), first);
  const std::string t = testing::http_request(port, "GET", "/metrics").body;
  const std::string labels = "{model_name=\"stories\",engine=\"0\"}";
  EXPECT_GT(metric(t, "vllm:external_prefix_cache_hits_total" + labels), 0) << t;
  EXPECT_GE(metric(t, "vllm:external_prefix_cache_queries_total" + labels),
            metric(t, "vllm:external_prefix_cache_hits_total" + labels));
  // Each prompt computes 157 tokens (150 and 7 of its outputs): 9 full blocks each, saved once.
  EXPECT_EQ(metric(t, "vllm:kv_offload_stored_blocks_total" + labels), 27);
  EXPECT_GT(metric(t, "vllm:kv_offload_loaded_blocks_total{model_name=\"stories\",engine=\"0\",tier=\"host\"}"), 0);
  EXPECT_EQ(metric(t, "vllm:kv_offload_failed_loads_total" + labels), 0);
  EXPECT_GT(metric(t, "vllm:kv_offload_capacity_blocks{model_name=\"stories\",engine=\"0\",tier=\"host\"}"), 0);
}

// Disaggregated prefill through `pagoda proxy`: a prefill instance on two tensor-parallel ranks and
// one on one rank (TcpConnector, kv_producer), a decode instance (ShmConnector, kv_consumer). The
// golden text and a streamed answer come out as one instance gives them; the decode instance
// computes none of the prompts; when a prefill instance dies, the proxy prefills elsewhere.
TEST(Server, ProxyPrefillDecodeKeepsTheGoldenTextAndSurvivesAPrefillInstance) {
  PAGODA_TEST_FILE(model_path, "stories260K/stories260K.gguf");
  PAGODA_TEST_FILE(txt, "stories260K/greedy-bos-256.txt");
  const int kv_port = testing::free_tcp_ports(3);  // 2 ranks, then 1
  auto config = [](const std::string& connector, const std::string& role, int port) {
    return "{\"kv_connector\": \"" + connector + "\", \"kv_role\": \"" + role + "\"" +
           (port > 0 ? ", \"kv_port\": " + std::to_string(port) : std::string()) + "}";
  };
  auto prefill_a = std::make_unique<ServerProcess>(
      PAGODA_BINARY, stories_args(model_path, {"-tp", "2", "--kv-transfer-config",
                                               config("TcpConnector", "kv_producer", kv_port)}));
  ServerProcess prefill_b(PAGODA_BINARY, stories_args(model_path, {"--kv-transfer-config",
                                                                    config("TcpConnector", "kv_producer", kv_port + 2)}));
  ServerProcess decode(PAGODA_BINARY, stories_args(model_path, {"--kv-transfer-config",
                                                                 config("ShmConnector", "kv_consumer", 0)}));
  ServerProcess one(PAGODA_BINARY, stories_args(model_path));
  ASSERT_NE(one.port(), 0);
  ASSERT_NE(prefill_a->port(), 0);
  ASSERT_NE(prefill_b.port(), 0);
  ASSERT_NE(decode.port(), 0);
  const auto url = [](uint16_t p) { return "http://127.0.0.1:" + std::to_string(p); };
  ServerProcess proxy(PAGODA_BINARY,
                      {"--prefill", url(prefill_a->port()) + "," + url(prefill_b.port()), "--decode", url(decode.port())},
                      std::chrono::seconds(60), {}, "listening on http://127.0.0.1:", "proxy");
  ASSERT_NE(proxy.port(), 0);

  int status = 0;
  json golden = post(proxy.port(), "/v1/completions", {{"prompt", ""}, {"max_tokens", 256}, {"temperature", 0}}, &status);
  ASSERT_EQ(status, 200) << golden.dump();
  std::ifstream in(txt);
  std::string want((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  want.pop_back();
  EXPECT_EQ(golden["choices"][0]["text"], want);
  // Both prefill instances in turn (fewest in flight, ties in turn), seeded and streamed.
  const json seeded = {{"prompt", "Once upon a time, there was a little girl named Lily. She liked to"},
                       {"max_tokens", 24}, {"temperature", 0.9}, {"seed", 4}};
  const std::string alone = post(one.port(), "/v1/completions", seeded, &status)["choices"][0]["text"];
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(post(proxy.port(), "/v1/completions", seeded, &status)["choices"][0]["text"], alone);
  }
  json streamed = seeded;
  streamed["stream"] = true;
  HttpResult sse = testing::http_request(proxy.port(), "POST", "/v1/completions", streamed.dump(),
                                         {{"content-type", "application/json"}});
  ASSERT_EQ(sse.status, 200);
  std::string text;
  for (size_t at = sse.body.find("data: {"); at != std::string::npos; at = sse.body.find("data: {", at + 1)) {
    text += json::parse(sse.body.substr(at + 6, sse.body.find('\n', at) - at - 6))["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, alone);

  const std::string d = testing::http_request(decode.port(), "GET", "/metrics").body;
  const std::string labels = "{model_name=\"stories\",engine=\"0\"";
  EXPECT_EQ(metric(d, "vllm:prompt_tokens_by_source_total" + labels + ",source=\"local_compute\"}"), 0) << d;
  EXPECT_GT(metric(d, "vllm:prompt_tokens_by_source_total" + labels + ",source=\"external_kv_transfer\"}"), 0);
  EXPECT_GT(metric(d, "vllm:kv_transfer_received_blocks_total" + labels + "}"), 0);
  EXPECT_EQ(metric(d, "vllm:kv_transfer_failed_total" + labels + "}"), 0);

  // The two-rank prefill instance dies: every request still comes back right, prefilled by the other.
  prefill_a.reset();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(post(proxy.port(), "/v1/completions", seeded, &status)["choices"][0]["text"], alone);
    EXPECT_EQ(status, 200);
  }
  const std::string p = testing::http_request(proxy.port(), "GET", "/metrics").body;
  EXPECT_GE(metric(p, "pagoda_proxy_prefill_retries_total"), 1) << p;
  EXPECT_EQ(metric(p, "pagoda_proxy_requests_total{outcome=\"ok\"}"), 1 + 3 + 1 + 3);
  EXPECT_EQ(testing::http_request(proxy.port(), "GET", "/health").status, 200);
  // A bad request comes back as the prefill instance's 400, and is not retried.
  json bad = post(proxy.port(), "/v1/completions", {{"prompt", "x"}, {"max_tokens", -3}}, &status);
  EXPECT_EQ(status, 400) << bad.dump();
  const std::string after = testing::http_request(decode.port(), "GET", "/metrics").body;
  EXPECT_EQ(metric(after, "vllm:prompt_tokens_by_source_total" + labels + ",source=\"local_compute\"}"), 0);
  EXPECT_EQ(metric(after, "vllm:kv_cache_usage_perc" + labels + "}"), 0);
}

// Every bad request gets its OpenAI error, and afterwards the canary request returns exactly
// what it returned before (checklist 4.2-4.4: "keeps serving").
TEST(Server, BadRequestsGetErrorsAndTheServerKeepsServing) {
  START_STORIES(server);
  const json canary = {{"prompt", "Once upon a time"}, {"max_tokens", 16}, {"temperature", 0}};
  int status = 0;
  json before = post(port, "/v1/completions", canary, &status);
  ASSERT_EQ(status, 200);

  struct Case {
    std::string path, body;
    int status;
    std::string type, param;
  };
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::vector<Case> cases = {
      {"/v1/completions", "", 400, "invalid_request_error", ""},
      {"/v1/completions", "not json{{{", 400, "invalid_request_error", ""},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": )", 400, "invalid_request_error", ""},
      {"/v1/completions", "[]", 400, "invalid_request_error", ""},
      {"/v1/completions", "42", 400, "invalid_request_error", ""},
      {"/v1/completions", "null", 400, "invalid_request_error", ""},
      {"/v1/completions", R"("str")", 400, "invalid_request_error", ""},
      {"/v1/completions", deep, 400, "invalid_request_error", ""},
      {"/v1/completions", R"({"prompt": {"a": )" + deep + "}", 400, "invalid_request_error", ""},
      {"/v1/completions", "{\"prompt\": \"\xff\xfe bad utf-8\"}", 400, "invalid_request_error", ""},
      {"/v1/completions", R"({"prompt": "\ud800"})", 400, "invalid_request_error", ""},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 1e400})", 400, "invalid_request_error", ""},
      {"/v1/completions", R"({"prompt": "a", "stream": "true"})", 400, "invalid_request_error", "stream"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": "10"})", 400, "invalid_request_error", "max_tokens"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 3.7})", 400, "invalid_request_error", "max_tokens"},
      {"/v1/completions", R"({"prompt": "a", "temperature": true})", 400, "invalid_request_error", "temperature"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 0})", 400, "invalid_request_error", "max_tokens"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": -1})", 400, "invalid_request_error", "max_tokens"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 9223372036854775807})", 400, "invalid_request_error", "max_tokens"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 18446744073709551615})", 400, "invalid_request_error", "max_tokens"},
      {"/v1/completions", R"({"prompt": "a", "n": 1000000})", 400, "invalid_request_error", "n"},
      {"/v1/completions", R"({"prompt": "a", "n": 0})", 400, "invalid_request_error", "n"},
      {"/v1/completions", R"({"prompt": ["a", "b", "c", "d", "e"], "n": 64})", 400, "invalid_request_error", "n"},
      {"/v1/completions", R"({"prompt": "a", "temperature": -1})", 400, "invalid_request_error", "temperature"},
      {"/v1/completions", R"({"prompt": "a", "temperature": 2.0001})", 400, "invalid_request_error", "temperature"},
      {"/v1/completions", R"({"prompt": "a", "top_p": 0})", 400, "invalid_request_error", "top_p"},
      {"/v1/completions", R"({"prompt": "a", "top_p": 1.5})", 400, "invalid_request_error", "top_p"},
      {"/v1/completions", R"({"prompt": "a", "top_k": -5})", 400, "invalid_request_error", "top_k"},
      {"/v1/completions", R"({"prompt": "a", "min_p": 2})", 400, "invalid_request_error", "min_p"},
      {"/v1/completions", R"({"prompt": "a", "presence_penalty": 2.0001})", 400, "invalid_request_error", "presence_penalty"},
      {"/v1/completions", R"({"prompt": "a", "frequency_penalty": -2.0001})", 400, "invalid_request_error", "frequency_penalty"},
      {"/v1/completions", R"({"prompt": "a", "repetition_penalty": 0})", 400, "invalid_request_error", "repetition_penalty"},
      {"/v1/completions", R"({"prompt": "a", "logprobs": 21})", 400, "invalid_request_error", "logprobs"},
      {"/v1/completions", R"({"prompt": "a", "logprobs": -1})", 400, "invalid_request_error", "logprobs"},
      {"/v1/completions", R"({"prompt": "a", "logit_bias": {"-1": 1}})", 400, "invalid_request_error", "logit_bias"},
      {"/v1/completions", R"({"prompt": "a", "logit_bias": {"999999999": 1}})", 400, "invalid_request_error", "logit_bias"},
      {"/v1/completions", R"({"prompt": "a", "logit_bias": {"abc": 1}})", 400, "invalid_request_error", "logit_bias"},
      {"/v1/completions", R"({"prompt": "a", "logit_bias": {"5": 1e9}})", 400, "invalid_request_error", "logit_bias"},
      {"/v1/completions", R"({"prompt": "a", "stop": [""]})", 400, "invalid_request_error", "stop"},
      {"/v1/completions", R"({"prompt": "a", "seed": 1.5})", 400, "invalid_request_error", "seed"},
      {"/v1/completions", R"({"prompt": "a", "seed": "x"})", 400, "invalid_request_error", "seed"},
      {"/v1/completions", R"({"prompt": [-1]})", 400, "invalid_request_error", "prompt"},
      {"/v1/completions", R"({"prompt": [512]})", 400, "invalid_request_error", "prompt"},
      {"/v1/completions", R"({"prompt": [2147483647]})", 400, "invalid_request_error", "prompt"},
      {"/v1/completions", R"({"prompt": []})", 400, "invalid_request_error", "prompt"},
      {"/v1/completions", R"({"prompt": [[]]})", 400, "invalid_request_error", "prompt"},
      {"/v1/completions", R"({"prompt": "", "add_special_tokens": false})", 400, "invalid_request_error", "prompt"},
      {"/v1/completions", R"({"prompt": "a", "model": "nope"})", 404, "not_found_error", "model"},
      {"/v1/completions", R"({"prompt": "a", "model": "../../etc/passwd"})", 404, "not_found_error", "model"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 5000})", 400, "invalid_request_error", "max_tokens"},
      {"/v1/chat/completions", R"({"messages": null})", 400, "invalid_request_error", "messages"},
      {"/v1/chat/completions", R"({"messages": "string"})", 400, "invalid_request_error", "messages"},
      {"/v1/chat/completions", R"({"messages": {}})", 400, "invalid_request_error", "messages"},
      {"/v1/chat/completions", R"({"messages": [123]})", 400, "invalid_request_error", "messages"},
      {"/v1/chat/completions", R"({"messages": [{}]})", 400, "invalid_request_error", "messages"},
      {"/v1/chat/completions", R"({"messages": [{"role": 123}]})", 400, "invalid_request_error", "messages"},
      {"/v1/chat/completions", R"({"messages": [{"role": "hacker", "content": "x"}]})", 400, "invalid_request_error", "messages"},
      {"/v1/chat/completions", R"({"messages": [{"role": "system", "content": 123}]})", 400, "invalid_request_error", "messages"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", 400, "invalid_request_error", "messages"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 5})", 400, "invalid_request_error", "top_logprobs"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})", 400, "invalid_request_error", "top_logprobs"},
      {"/tokenize", R"({"prompt": 5})", 400, "invalid_request_error", "prompt"},
      {"/detokenize", R"({"tokens": [-1]})", 400, "invalid_request_error", "tokens"},
      {"/detokenize", R"({"tokens": [100000]})", 400, "invalid_request_error", "tokens"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path + " " + c.body.substr(0, 120));
    HttpResult r = testing::http_request(port, "POST", c.path, c.body);
    EXPECT_EQ(r.status, c.status) << r.body;
    json j = json::parse(r.body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.body;
    expect_error(j, c.type);
    if (!c.param.empty()) {
      EXPECT_EQ(j["error"]["param"], c.param) << r.body;
    }
    json after = post(port, "/v1/completions", canary, &status);
    ASSERT_EQ(status, 200);
    EXPECT_EQ(after["choices"], before["choices"]);
    EXPECT_EQ(after["usage"], before["usage"]);
  }
}

TEST(Server, OverlongPromptsRepeatedAndConcurrentGet400) {
  START_STORIES(server);
  json ids = json::array();
  for (int i = 0; i < 3000; ++i) ids.push_back(300 + i % 100);
  const json req = {{"prompt", ids}, {"max_tokens", 5}};
  for (int i = 0; i < 3; ++i) {
    int status = 0;
    json r = post(port, "/v1/completions", req, &status);
    EXPECT_EQ(status, 400);
    EXPECT_EQ(r["error"]["code"], "context_length_exceeded") << r.dump();
  }
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int t = 0; t < 10; ++t) {
    clients.emplace_back([&] {
      HttpResult r = testing::http_request(port, "POST", "/v1/completions", req.dump());
      if (r.status == 400 && r.body.find("context_length_exceeded") != std::string::npos) ++ok;
    });
  }
  for (auto& c : clients) c.join();
  EXPECT_EQ(ok.load(), 10);
  int status = 0;
  post(port, "/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 3}}, &status);
  EXPECT_EQ(status, 200);
}

// The HTTP layer's own defences (checklist 4.1).
TEST(Server, MalformedHttpIsRefusedAndConnectionsStayUsable) {
  START_STORIES(server, {"--max-request-body", "1MiB"});
  auto status_of = [](const std::string& response) {
    int s = 0;
    std::sscanf(response.c_str(), "HTTP/1.1 %d", &s);
    return s;
  };
  // One 100 KB header, and many headers.
  EXPECT_EQ(status_of(testing::raw_exchange(port, "GET /health HTTP/1.1\r\nX-Big: " + std::string(100000, 'a') + "\r\n\r\n")), 431);
  std::string many = "GET /health HTTP/1.1\r\n";
  for (int i = 0; i < 10000; ++i) many += "X-" + std::to_string(i) + ": y\r\n";
  EXPECT_EQ(status_of(testing::raw_exchange(port, many + "\r\n")), 431);
  // A header line that never ends: cut off at the cap, not buffered forever.
  EXPECT_EQ(status_of(testing::raw_exchange(port, "GET /health HTTP/1.1\r\nX: " + std::string(2 << 20, 'a'))), 431);
  // A declared body over the cap gets 413 before any of it is sent.
  EXPECT_EQ(status_of(testing::raw_exchange(
                port, "POST /v1/completions HTTP/1.1\r\nContent-Length: 1000000000000\r\nContent-Type: application/json\r\n\r\n")),
            413);
  // Bad chunk sizes, and Content-Length together with Transfer-Encoding.
  for (const char* size : {"-2", "fffffffffffffffff", "zz"}) {
    EXPECT_EQ(status_of(testing::raw_exchange(port, std::string("POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n") +
                                                        size + "\r\nabc\r\n0\r\n\r\n")),
              400)
        << size;
  }
  EXPECT_EQ(status_of(testing::raw_exchange(port,
                                            "POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                                            "0\r\n\r\n")),
            400);
  EXPECT_EQ(status_of(testing::raw_exchange(port, "POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\nabcde")),
            400);
  // Routes: wrong method, unknown paths and odd spellings of real ones.
  HttpResult wrong = testing::http_request(port, "GET", "/v1/completions");
  EXPECT_EQ(wrong.status, 405);
  EXPECT_EQ(wrong.headers["allow"], "POST");
  expect_error(json::parse(wrong.body), "invalid_request_error");
  for (const char* path : {"/nope", "/V1/models", "//v1/models", "/v1/../v1/models", "/v1/%6dodels"}) {
    HttpResult r = testing::http_request(port, "GET", path);
    EXPECT_EQ(r.status, 404) << path;
    expect_error(json::parse(r.body), "not_found_error");
  }
  // Pipelined requests are answered in order; a connection is reused after a 400.
  std::string pipelined = "GET /version HTTP/1.1\r\nHost: x\r\n\r\n"
                          "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
                          "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  std::string out = testing::raw_exchange(port, pipelined);
  size_t a = out.find("HTTP/1.1 200"), b = out.find("HTTP/1.1 400"), c = out.find("HTTP/1.1 200", a + 1);
  EXPECT_TRUE(a != std::string::npos && b != std::string::npos && c != std::string::npos && a < b && b < c) << out;
  // A keep-alive connection whose second request is refused still gets its answer.
  std::string second = testing::raw_exchange(port, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                                                   "GET /health HTTP/1.1\r\nX-Big: " + std::string(100000, 'a') + "\r\n\r\n");
  a = second.find("HTTP/1.1 200");
  b = second.find("HTTP/1.1 431");
  EXPECT_TRUE(a != std::string::npos && b != std::string::npos && a < b) << second.substr(0, 300);
  // HEAD: the headers of GET, no body.
  std::string head = testing::raw_exchange(port, "HEAD /v1/models HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(status_of(head), 200) << head;
  EXPECT_EQ(head.substr(head.find("\r\n\r\n") + 4), "");
  EXPECT_NE(head.find("Content-Length: "), std::string::npos);
  // An HTTP/1.0 client cannot read chunks: its stream is plain bytes ended by closing.
  const std::string stream_body = R"({"prompt": "Hi", "max_tokens": 4, "stream": true})";
  std::string old = testing::raw_exchange(port, "POST /v1/completions HTTP/1.0\r\nContent-Length: " +
                                                    std::to_string(stream_body.size()) + "\r\n\r\n" + stream_body);
  EXPECT_EQ(status_of(old), 200) << old;
  EXPECT_EQ(old.find("chunked"), std::string::npos) << old;
  EXPECT_NE(old.find("\r\n\r\ndata: {"), std::string::npos) << old;
  EXPECT_EQ(old.substr(old.size() - 14), "data: [DONE]\n\n") << old;
  // Text/plain carrying JSON is read as JSON (the body decides, as vLLM does).
  HttpResult plain = testing::http_request(port, "POST", "/v1/completions", R"({"prompt": "Hi", "max_tokens": 2})",
                                           {{"Content-Type", "text/plain"}});
  EXPECT_EQ(plain.status, 200) << plain.body;
  EXPECT_EQ(testing::http_request(port, "GET", "/health").status, 200);
}

// (A key with a trailing space cannot be told apart over HTTP: trailing whitespace of a header
// value is not part of it, RFC 9110 5.5, so it is not among the wrong keys here.)
TEST(Server, ApiKeyGuardsEveryRouteButHealth) {
  PAGODA_TEST_FILE(model_path, "stories260K/stories260K.gguf");
  const std::string key = "sk-test-0123456789";
  ServerProcess server(PAGODA_BINARY, stories_args(model_path, {"--api-key", key}));
  ASSERT_NE(server.port(), 0);
  const uint16_t port = server.port();
  EXPECT_EQ(testing::http_request(port, "GET", "/health").status, 200);
  const std::string body = R"({"prompt": "Hi", "max_tokens": 2})";
  for (const testing::Headers& bad : std::vector<testing::Headers>{
           {}, {{"Authorization", ""}}, {{"Authorization", "Bearer "}}, {{"Authorization", "Bearer wrong"}},
           {{"Authorization", "Basic " + key}}, {{"Authorization", "Bearer " + key + "0"}},
           {{"Authorization", "Bearer  " + key}},
           {{"Authorization", "Bearer " + key.substr(0, key.size() - 1)}}}) {
    for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
             {"POST", "/v1/completions"}, {"POST", "/v1/chat/completions"}, {"GET", "/v1/models"}, {"GET", "/metrics"},
             {"POST", "/tokenize"}, {"POST", "/detokenize"}, {"GET", "/version"}, {"GET", "/nope"}, {"GET", "/V1/models"}}) {
      HttpResult r = testing::http_request(port, method, path, method == "POST" ? body : "", bad);
      EXPECT_EQ(r.status, 401) << method << " " << path;
      json j = json::parse(r.body, nullptr, false);
      expect_error(j, "authentication_error");
      EXPECT_EQ(j["error"]["code"], "invalid_api_key");
    }
  }
  // Refused before the body is read: a client without the key cannot make the server buffer a
  // body (it announces 1 MB and sends none; the 401 comes anyway).
  std::string early = testing::raw_exchange(
      port, "POST /v1/completions HTTP/1.1\r\nContent-Length: 1000000\r\nContent-Type: application/json\r\n\r\n",
      std::chrono::seconds(5));
  EXPECT_EQ(early.rfind("HTTP/1.1 401", 0), 0u) << early;
  EXPECT_EQ(testing::http_request(port, "POST", "/v1/completions", body, {{"Authorization", "Bearer " + key}}).status, 200);
  EXPECT_EQ(testing::http_request(port, "GET", "/v1/models", "", {{"X-Api-Key", key}}).status, 200);
  EXPECT_EQ(server.log().find(key), std::string::npos) << "the key appears in the log";
}

TEST(Server, MetricsNoAuthKeyFromEnvironmentAndCacheInfo) {
  PAGODA_TEST_FILE(model_path, "stories260K/stories260K.gguf");
  ServerProcess server(PAGODA_BINARY, stories_args(model_path, {"--metrics-no-auth", "--no-enable-prefix-caching"}),
                       std::chrono::seconds(60), {{"PAGODA_API_KEY", "env-key"}});
  ASSERT_NE(server.port(), 0);
  HttpResult m = testing::http_request(server.port(), "GET", "/metrics");
  EXPECT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("vllm:cache_config_info{model_name=\"stories\",engine=\"0\",block_size=\"16\",num_gpu_blocks=\""),
            std::string::npos);
  EXPECT_NE(m.body.find("enable_prefix_caching=\"False\""), std::string::npos) << m.body;
  EXPECT_EQ(testing::http_request(server.port(), "GET", "/v1/models").status, 401);
  EXPECT_EQ(testing::http_request(server.port(), "GET", "/v1/models", "", {{"Authorization", "Bearer env-key"}}).status, 200);
}

// A client that goes away (while queued, mid-decode, or streaming) ends its request; the engine
// frees its blocks, and at idle nothing is running, waiting, or holding KV cache.
TEST(Server, DisconnectsAbortRequests) {
  PAGODA_TEST_FILE(tok, "vocab/ggml-vocab-llama-spm.gguf");
  ServerProcess server(PAGODA_BINARY, slow_args(tok, {"--max-num-seqs", "1"}));
  ASSERT_NE(server.port(), 0);
  const uint16_t port = server.port();
  const json long_req = {{"prompt", "Once upon a time"}, {"max_tokens", 900}, {"ignore_eos", true}, {"stream", true}};

  // Streaming, mid-decode.
  auto running = std::make_unique<SseClient>(port, "/v1/completions", long_req.dump());
  ASSERT_EQ(running->status(), 200);
  ASSERT_TRUE(running->next().has_value());
  // A second request waits behind it (max-num-seqs 1); a non-streaming client then leaves.
  json queued = long_req;
  queued["stream"] = false;
  std::thread leaver([&] { testing::http_request(port, "POST", "/v1/completions", queued.dump(), {}, std::chrono::milliseconds(300)); });
  leaver.join();
  running->close();
  EXPECT_TRUE(wait_idle(port, "slow")) << testing::http_request(port, "GET", "/metrics").body;
  HttpResult m = testing::http_request(port, "GET", "/metrics");
  EXPECT_EQ(metric(m.body, "vllm:request_success_total{model_name=\"slow\",engine=\"0\",finished_reason=\"abort\"}"), 2) << m.body;

  // Non-streaming mid-decode.
  testing::http_request(port, "POST", "/v1/completions", queued.dump(), {}, std::chrono::milliseconds(500));
  EXPECT_TRUE(wait_idle(port, "slow"));
  // The server still answers.
  int status = 0;
  post(port, "/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 2}}, &status);
  EXPECT_EQ(status, 200);
}

// A client that stops reading its stream (checklist R4): once the data the server holds for it
// passes --max-unsent-stream (or one write waits --http-write-timeout), the connection is dropped,
// the request aborted and its KV blocks freed, while a stream beside it gets all its output.
TEST(Server, StalledReaderIsDroppedAndOthersServed) {
  START_STORIES(server, {"--max-unsent-stream", "64KiB", "--http-write-timeout", "3"});
  // 8 sequences of 400 tokens, at about 150 bytes of SSE per token: some 500 KB, far more than
  // the 64 KiB cap plus what the socket buffers of a reader with a minimal window absorb.
  const json big = {{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"n", 8},       {"ignore_eos", true},
                    {"stream", true},               {"seed", 7},         {"temperature", 1.0}};
  testing::StalledClient stalled(port, "/v1/completions", big.dump());
  ASSERT_TRUE(stalled.sent());

  json greedy = {{"prompt", {1}}, {"max_tokens", 256}, {"temperature", 0}, {"stream", true}};
  SseClient other(port, "/v1/completions", greedy.dump());
  ASSERT_EQ(other.status(), 200);
  std::string text;
  for (const std::string& e : other.rest()) {
    if (e == "[DONE]") continue;
    text += json::parse(e)["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, golden_text());

  EXPECT_TRUE(wait_idle(port, "stories", std::chrono::seconds(20)))
      << testing::http_request(port, "GET", "/metrics").body;
  const std::string m = testing::http_request(port, "GET", "/metrics").body;
  // Its 8 sequences are 8 engine requests (as in vLLM), all aborted.
  EXPECT_EQ(metric(m, "vllm:request_success_total{model_name=\"stories\",engine=\"0\",finished_reason=\"abort\"}"), 8) << m;
  EXPECT_EQ(metric(m, "vllm:request_success_total{model_name=\"stories\",engine=\"0\",finished_reason=\"length\"}"), 1) << m;
  EXPECT_TRUE(stalled.closed_by_server(std::chrono::seconds(10)));
  int status = 0;
  post(port, "/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 2}}, &status);
  EXPECT_EQ(status, 200);
}

// KV exhaustion through the server (checklist R5, R6): a cache of 640 tokens and 8 concurrent
// requests that need about 300 each. They are preempted and recomputed in turn, yet each returns
// what it returns alone; a short request sent behind them completes (first come, first served,
// as vLLM); one that could never fit is refused at once instead of waiting at the head of the
// queue; and the cache is empty at the end.
TEST(Server, KvExhaustionPreemptsWithoutLossOrBlocking) {
  // 640 tokens of 1280 bytes (stories260K: 5 layers x K, V x 4 kv heads x 8 x 4 bytes).
  START_STORIES(server, {"--kv-cache-memory", "819200", "--max-model-len", "512"});
  std::vector<json> reqs;
  for (int i = 0; i < 8; ++i) {
    std::string prompt = "Once upon a time, there was a little girl named Lily.";
    for (int k = 0; k <= i % 3; ++k) prompt += " She liked to play with her ball in the park.";
    reqs.push_back({{"prompt", prompt}, {"max_tokens", 240}, {"temperature", 0}, {"ignore_eos", true}});
  }
  std::vector<std::string> alone;
  for (const json& r : reqs) {
    int status = 0;
    json out = post(port, "/v1/completions", r, &status);
    ASSERT_EQ(status, 200) << out.dump();
    alone.push_back(out["choices"][0]["text"]);
  }
  const double preempted_before = metric(testing::http_request(port, "GET", "/metrics").body,
                                         "vllm:num_preemptions_total{model_name=\"stories\",engine=\"0\"}");

  std::vector<std::string> together(reqs.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < reqs.size(); ++i) {
    clients.emplace_back([&, i] {
      int status = 0;
      json out = post(port, "/v1/completions", reqs[i], &status);
      if (status == 200) together[i] = out["choices"][0]["text"];
    });
  }
  // Behind them: a short request, and one that can never fit (refused, not queued).
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  int status = 0;
  json never = post(port, "/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 600}}, &status);
  EXPECT_EQ(status, 400) << never.dump();
  json quick = post(port, "/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 4}}, &status);
  EXPECT_EQ(status, 200) << quick.dump();
  for (auto& t : clients) t.join();

  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(together[i], alone[i]) << "request " << i;
  const std::string m = testing::http_request(port, "GET", "/metrics").body;
  EXPECT_GT(metric(m, "vllm:num_preemptions_total{model_name=\"stories\",engine=\"0\"}"), preempted_before) << m;
  EXPECT_TRUE(wait_idle(port, "stories")) << m;
}

// Beyond --max-queued-requests new requests get 429 at once, while /health and /metrics stay fast.
TEST(Server, OverloadGets429AndHealthStaysFast) {
  PAGODA_TEST_FILE(tok, "vocab/ggml-vocab-llama-spm.gguf");
  ServerProcess server(PAGODA_BINARY, slow_args(tok, {"--max-num-seqs", "1", "--max-queued-requests", "2"}));
  ASSERT_NE(server.port(), 0);
  const uint16_t port = server.port();
  const json long_req = {{"prompt", "Once upon a time"}, {"max_tokens", 900}, {"ignore_eos", true}, {"stream", true}};
  std::vector<std::unique_ptr<SseClient>> held;
  held.push_back(std::make_unique<SseClient>(port, "/v1/completions", long_req.dump()));
  ASSERT_TRUE(held[0]->next().has_value());  // running
  for (int i = 0; i < 2; ++i) {              // waiting
    held.push_back(std::make_unique<SseClient>(port, "/v1/completions", long_req.dump()));
    EXPECT_EQ(held.back()->status(), 200);
  }
  // Make sure the engine has taken both waiting requests in (a loaded machine may be slow).
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  double waiting = 0;
  while (Clock::now() < deadline &&
         (waiting = metric(testing::http_request(port, "GET", "/metrics").body,
                           "vllm:num_requests_waiting{model_name=\"slow\",engine=\"0\"}")) < 2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(waiting, 2);
  HttpResult over = testing::http_request(port, "POST", "/v1/completions", R"({"prompt": "Hi", "max_tokens": 2})", {},
                                          std::chrono::seconds(10));
  EXPECT_EQ(over.status, 429) << over.body;
  EXPECT_EQ(over.headers["retry-after"], "1");
  expect_error(json::parse(over.body), "rate_limit_error");

  std::vector<double> health_ms, metrics_ms;
  for (int i = 0; i < 9; ++i) {
    auto t0 = Clock::now();
    EXPECT_EQ(testing::http_request(port, "GET", "/health").status, 200);
    auto t1 = Clock::now();
    EXPECT_EQ(testing::http_request(port, "GET", "/metrics").status, 200);
    auto t2 = Clock::now();
    health_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    metrics_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
  std::sort(health_ms.begin(), health_ms.end());
  std::sort(metrics_ms.begin(), metrics_ms.end());
  EXPECT_LT(health_ms[4], 100.0);  // the median: one slow probe on a shared machine is noise
  EXPECT_LT(metrics_ms[4], 100.0);
  held.clear();
  EXPECT_TRUE(wait_idle(port, "slow"));
}

// SIGTERM: health turns 503 and new work is refused at once; a short request in flight
// finishes; the long ones end with an error event and [DONE] at the timeout; exit status 0.
TEST(Server, SigtermDrainsThenExitsZero) {
  PAGODA_TEST_FILE(tok, "vocab/ggml-vocab-llama-spm.gguf");
  // 8 s of grace. The short request has one step left when the signal comes: its last two steps
  // beside two long ones took over 5 s under ASan on a loaded 2-core machine. The long ones have
  // about 1000 left, which no 2-core machine runs in 8 s (3 rows of a 440 MB f32 model a step).
  ServerProcess server(PAGODA_BINARY, slow_args(tok, {"--shutdown-timeout", "8"}));
  ASSERT_NE(server.port(), 0);
  const uint16_t port = server.port();
  const json long_req = {{"prompt", "Once upon a time"}, {"max_tokens", 1000}, {"ignore_eos", true}, {"stream", true}};
  std::vector<std::unique_ptr<SseClient>> longs;
  for (int i = 0; i < 2; ++i) {
    longs.push_back(std::make_unique<SseClient>(port, "/v1/completions", long_req.dump()));
    ASSERT_TRUE(longs.back()->next().has_value());
  }
  json short_req = {{"prompt", "Hi"}, {"max_tokens", 2}, {"ignore_eos", true}, {"stream", true}};
  SseClient short_stream(port, "/v1/completions", short_req.dump());
  ASSERT_EQ(short_stream.status(), 200);
  // Its first token is out: one decode step is left, well inside the grace period even on a
  // loaded machine under a sanitizer.
  std::optional<std::string> first = short_stream.next();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->find("\"error\""), std::string::npos) << *first;

  server.send_signal(SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(testing::http_request(port, "GET", "/health").status, 503);
  HttpResult refused = testing::http_request(port, "POST", "/v1/completions", R"({"prompt": "Hi", "max_tokens": 2})");
  EXPECT_EQ(refused.status, 503) << refused.body;

  std::vector<std::string> s = short_stream.rest();
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(s.back(), "[DONE]");
  for (const std::string& e : s) EXPECT_EQ(e.find("\"error\""), std::string::npos) << e;

  for (auto& l : longs) {
    std::vector<std::string> rest = l->rest();
    ASSERT_GE(rest.size(), 2u);
    EXPECT_EQ(rest.back(), "[DONE]");
    json err = json::parse(rest[rest.size() - 2], nullptr, false);
    ASSERT_FALSE(err.is_discarded()) << rest[rest.size() - 2];
    EXPECT_TRUE(err.contains("error")) << rest[rest.size() - 2];
  }
  EXPECT_EQ(server.wait_exit(std::chrono::seconds(15)), std::optional<int>(0)) << server.log();
}

// /health is 503 while the model loads (the server listens first), then 200; the API routes
// answer 503 meanwhile rather than refusing the connection.
TEST(Server, HealthIs503WhileLoading) {
  PAGODA_TEST_FILE(tok, "stories260K/stories260K.gguf");
  // A dummy 1.1B-parameter model: a few seconds of random weights to fill.
  ServerProcess server(PAGODA_BINARY,
                       {"tinyllama-1.1b", "--load-format", "dummy", "--tokenizer", tok, "--max-model-len", "256",
                        "--kv-cache-memory", "64MiB", "--disable-log-stats"},
                       std::chrono::seconds(60), {}, "listening on http://127.0.0.1:");
  ASSERT_NE(server.port(), 0);
  const uint16_t port = server.port();
  HttpResult loading = testing::http_request(port, "GET", "/health");
  EXPECT_EQ(loading.status, 503) << loading.body;
  if (loading.status == 503) expect_error(json::parse(loading.body), "server_error");
  EXPECT_EQ(loading.headers["retry-after"], "1");
  HttpResult early = testing::http_request(port, "POST", "/v1/completions", R"({"prompt": "Hi"})");
  EXPECT_EQ(early.status, 503) << early.body;
  EXPECT_EQ(poll_health(port, Clock::now() + std::chrono::seconds(60), 200).status, 200) << server.log();
  EXPECT_NE(server.log().find("ready: "), std::string::npos);
}

// Slowloris (checklist H8): 2,000 connections that each send a few header bytes and stall. The
// server keeps answering others at once, and drops the stalled ones at the header deadline.
TEST(Server, SlowHeaderClientsAreDroppedAndOthersServed) {
  PAGODA_TEST_FILE(model_path, "stories260K/stories260K.gguf");
  ServerProcess server(PAGODA_BINARY, stories_args(model_path, {"--http-header-timeout", "2"}));
  ASSERT_NE(server.port(), 0);
  const uint16_t port = server.port();
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  const int wanted = 2000;
  const int count = static_cast<int>(std::min<rlim_t>(wanted, rl.rlim_cur > 200 ? rl.rlim_cur - 100 : 0));
  ASSERT_GE(count, 500) << "the file descriptor limit is too low for this test";
  std::vector<int> fds;
  for (int i = 0; i < count; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << i;
    const char partial[] = "GET /health HTTP/1.1\r\nX-Slow: a";
    ASSERT_GT(::send(fd, partial, sizeof partial - 1, MSG_NOSIGNAL), 0);
    fds.push_back(fd);
  }
  std::vector<double> ms;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    EXPECT_EQ(testing::http_request(port, "GET", "/health").status, 200);
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  EXPECT_LT(ms[2], 100.0);
  int status = 0;
  post(port, "/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 4}}, &status);
  EXPECT_EQ(status, 200);
  // They keep trickling a header byte every 400 ms, as slowloris does; the 2 s deadline is for
  // the whole header, so after it every one of them has been closed by the server.
  for (int round = 0; round < 7; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    for (int fd : fds) ::send(fd, "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  int closed = 0;
  for (int fd : fds) {
    pollfd p{fd, POLLIN, 0};
    char c;
    if (::poll(&p, 1, 2000) == 1 && ::recv(fd, &c, 1, 0) <= 0) ++closed;
    ::close(fd);
  }
  EXPECT_EQ(closed, count);
}

// A step that throws (an injected fault): requests in flight end with an error (an error event
// then [DONE] in a stream, 500 otherwise), and the server exits with status 1 (the engine cannot
// recover; a supervisor restarts it), refusing work with 503 until it is gone.
TEST(Server, EngineFailureIsReportedNotHidden) {
  PAGODA_TEST_FILE(tok, "vocab/ggml-vocab-llama-spm.gguf");
  // The slow model: both requests are surely in flight when step 20 fails (the second is sent
  // as soon as the first's head is back; 20 steps take a second here and a minute or more under
  // ASan on a loaded machine, so the whole request waits with a long timeout).
  ServerProcess server(PAGODA_BINARY, slow_args(tok, {"--fault-injection", "throw-at-step:20"}));
  ASSERT_NE(server.port(), 0);
  const uint16_t port = server.port();
  const json req = {{"prompt", "Once upon a time"}, {"max_tokens", 200}, {"ignore_eos", true}, {"temperature", 0}};
  json streamed = req;
  streamed["stream"] = true;
  SseClient sse(port, "/v1/completions", streamed.dump());
  ASSERT_EQ(sse.status(), 200);
  HttpResult whole = testing::http_request(port, "POST", "/v1/completions", req.dump(), {}, std::chrono::minutes(5));
  std::vector<std::string> events = sse.rest();
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  json err = json::parse(events[events.size() - 2], nullptr, false);
  ASSERT_FALSE(err.is_discarded());
  expect_error(err, "server_error");
  EXPECT_EQ(whole.status, 500) << whole.body;
  // Then the server drains and exits 1; until it is gone it says 503, never 200 (status 0: the
  // connection was refused, it is gone).
  HttpResult health = testing::http_request(port, "GET", "/health");
  EXPECT_TRUE(health.status == 503 || health.status == 0) << health.status << " " << health.body;
  HttpResult after = testing::http_request(port, "POST", "/v1/completions", R"({"prompt": "Hi"})");
  EXPECT_TRUE(after.status == 503 || after.status == 0) << after.status << " " << after.body;
  EXPECT_EQ(server.wait_exit(std::chrono::seconds(15)), std::optional<int>(1)) << server.log();
  EXPECT_NE(server.log().find("the engine has failed (injected fault at step 20); exiting with status 1"),
            std::string::npos)
      << server.log();
}

// The rest of a stream: an error event (a server_error), then [DONE].
void expect_stream_ends_with_server_error(SseClient& sse) {
  std::vector<std::string> events = sse.rest();
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  json err = json::parse(events[events.size() - 2], nullptr, false);
  ASSERT_FALSE(err.is_discarded()) << events[events.size() - 2];
  expect_error(err, "server_error");
}

// The processes whose parent is `pid` (from /proc/<p>/stat's fourth field).
std::vector<int> children_of(int pid) {
  std::vector<int> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const size_t paren = line.rfind(')');
    if (paren == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(line.c_str() + paren + 1, " %c %d", &state, &ppid) == 2 && ppid == pid && state != 'Z') {
      out.push_back(std::stoi(name));
    }
  }
  return out;
}

// Tensor parallelism over two ranks forked by the server (--tensor-parallel-size 2): requests are
// served; then rank 1 killed mid-step fails the step: the streamed request in flight ends with a
// server_error, /health says 503 (or the server is gone), and the server exits 1 within seconds,
// its log naming the rank that died.
TEST(Server, TensorParallelRankKilledMidStepFailsTheServer) {
  PAGODA_TEST_FILE(tok, "vocab/ggml-vocab-llama-spm.gguf");
  ServerProcess server(PAGODA_BINARY, slow_args(tok, {"--tensor-parallel-size", "2"}));
  ASSERT_NE(server.port(), 0);
  const uint16_t port = server.port();
  const std::vector<int> workers = children_of(server.pid());
  ASSERT_EQ(workers.size(), 1u) << server.log();
  int status = 0;
  json done = post(port, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 5}}, &status);
  EXPECT_EQ(status, 200) << done.dump();
  const json req = {{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}};
  SseClient sse(port, "/v1/completions", req.dump());
  ASSERT_EQ(sse.status(), 200);
  ASSERT_TRUE(sse.next().has_value());  // decoding
  const auto killed = Clock::now();
  ASSERT_EQ(kill(workers[0], SIGKILL), 0);
  expect_stream_ends_with_server_error(sse);
  HttpResult health = testing::http_request(port, "GET", "/health");
  EXPECT_TRUE(health.status == 503 || health.status == 0) << health.status << " " << health.body;
  EXPECT_EQ(server.wait_exit(std::chrono::seconds(15)), std::optional<int>(1)) << server.log();
  EXPECT_LT(Clock::now() - killed, std::chrono::seconds(10));
  // The step's wait for the rank, or the server's watch over its ranks, names it first.
  EXPECT_NE(server.log().find("rank 1 (pid " + std::to_string(workers[0]) + ")"), std::string::npos) << server.log();
}

// Two streams in flight on a server of two ranks started with `flags`; rank 1 killed: both
// streams end with a server_error, and the server exits 1 within seconds, naming the rank.
void expect_killed_rank_fails_both_streams(const std::vector<std::string>& flags) {
  PAGODA_TEST_FILE(tok, "vocab/ggml-vocab-llama-spm.gguf");
  ServerProcess server(PAGODA_BINARY, slow_args(tok, flags));
  ASSERT_NE(server.port(), 0);
  const uint16_t port = server.port();
  const std::vector<int> workers = children_of(server.pid());
  ASSERT_EQ(workers.size(), 1u) << server.log();
  const json req = {{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}};
  SseClient first(port, "/v1/completions", req.dump());
  ASSERT_EQ(first.status(), 200);
  ASSERT_TRUE(first.next().has_value());
  SseClient second(port, "/v1/completions", req.dump());
  ASSERT_EQ(second.status(), 200);
  ASSERT_TRUE(second.next().has_value());
  const auto killed = Clock::now();
  ASSERT_EQ(kill(workers[0], SIGKILL), 0);
  for (SseClient* sse : {&first, &second}) expect_stream_ends_with_server_error(*sse);
  EXPECT_EQ(server.wait_exit(std::chrono::seconds(15)), std::optional<int>(1)) << server.log();
  EXPECT_LT(Clock::now() - killed, std::chrono::seconds(10));
  EXPECT_NE(server.log().find("rank 1 (pid " + std::to_string(workers[0]) + ")"), std::string::npos) << server.log();
}

// The same with two pipeline stages, while steps are in flight: killing the last stage (which
// sends rank 0 the outputs) fails both streams.
TEST(Server, PipelineRankKilledMidStepFailsTheServer) {
  expect_killed_rank_fails_both_streams({"--pipeline-parallel-size", "2"});
}

// A rank that dies while the server is idle stops the server too, within a second or two, naming
// the rank: no request has to fail first for the supervisor to learn of it.
TEST(Server, TensorParallelRankDeadWhileIdleStopsTheServer) {
  START_STORIES(server, {"--tensor-parallel-size", "2"});
  EXPECT_EQ(testing::http_request(port, "GET", "/health").status, 200);
  const std::vector<int> workers = children_of(server.pid());
  ASSERT_EQ(workers.size(), 1u) << server.log();
  ASSERT_EQ(kill(workers[0], SIGKILL), 0);
  EXPECT_EQ(server.wait_exit(std::chrono::seconds(10)), std::optional<int>(1)) << server.log();
  EXPECT_NE(server.log().find("the engine has failed (rank 1 (pid " + std::to_string(workers[0]) +
                              ") was killed by signal 9)"),
            std::string::npos)
      << server.log();
}

// Data parallelism (--data-parallel-size 2: a second replica on a forked rank): concurrent
// requests are spread over both replicas, each gives the golden greedy text, and /metrics has
// every series per replica (vLLM's engine label), the replicas' tokens adding up to the total.
TEST(Server, DataParallelReplicasShareTheLoadAndKeepTheGoldenText) {
  PAGODA_TEST_FILE(model_path, "stories260K/stories260K.gguf");
  // The periodic log line on (every 0.2 s, vLLM's variable): the sums, then each replica's share.
  std::vector<std::string> args = stories_args(model_path, {"--data-parallel-size", "2"});
  args.erase(std::find(args.begin(), args.end(), "--disable-log-stats"));
  ServerProcess server(PAGODA_BINARY, args, std::chrono::seconds(180), {{"VLLM_LOG_STATS_INTERVAL", "0.2"}});
  ASSERT_NE(server.port(), 0);
  const uint16_t port = server.port();
  EXPECT_EQ(children_of(server.pid()).size(), 1u) << server.log();
  constexpr int kRequests = 6;
  std::vector<json> answers(kRequests);
  std::vector<int> statuses(kRequests, 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back([&, i] {
      answers[static_cast<size_t>(i)] =
          post(port, "/v1/completions", {{"prompt", {1}}, {"max_tokens", 256}, {"temperature", 0}},
               &statuses[static_cast<size_t>(i)]);
    });
  }
  for (auto& c : clients) c.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_EQ(statuses[static_cast<size_t>(i)], 200) << answers[static_cast<size_t>(i)].dump();
    EXPECT_EQ(answers[static_cast<size_t>(i)]["choices"][0]["text"], golden_text()) << i;
  }
  const std::string m = testing::http_request(port, "GET", "/metrics").body;
  const double first = metric(m, "vllm:generation_tokens_total{model_name=\"stories\",engine=\"0\"}");
  const double second = metric(m, "vllm:generation_tokens_total{model_name=\"stories\",engine=\"1\"}");
  EXPECT_GT(first, 0) << m;
  EXPECT_GT(second, 0) << m;
  EXPECT_EQ(first + second, kRequests * 256) << m;
  EXPECT_EQ(metric(m, "vllm:request_success_total{model_name=\"stories\",engine=\"0\",finished_reason=\"length\"}") +
                metric(m, "vllm:request_success_total{model_name=\"stories\",engine=\"1\",finished_reason=\"length\"}"),
            kRequests)
      << m;
  EXPECT_EQ(metric(m, "vllm:num_requests_running{model_name=\"stories\",engine=\"1\"}"), 0) << m;
  EXPECT_NE(m.find("vllm:cache_config_info{model_name=\"stories\",engine=\"1\","), std::string::npos) << m;
  EXPECT_NE(server.log().find("data parallelism: 2 engine replicas"), std::string::npos) << server.log();
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (server.log().find("(2 engines: running ") == std::string::npos && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(server.log().find("Avg generation throughput: "), std::string::npos) << server.log();
  EXPECT_NE(server.log().find("(2 engines: running "), std::string::npos) << server.log();
}

// Speculative decoding with a draft model in every data-parallel replica: the draft runs in each
// replica's worker, next to its model (replica 1's on its own forked rank), so both replicas
// draft and verify, and every answer is still the golden greedy text.
TEST(Server, DataParallelReplicasEachRunTheirDraftModel) {
  PAGODA_TEST_FILE(model_path, "stories260K/stories260K.gguf");
  const std::string draft = R"({"model": ")" + model_path + R"(", "num_speculative_tokens": 3})";
  ServerProcess server(PAGODA_BINARY, stories_args(model_path, {"--data-parallel-size", "2", "--speculative-config", draft}),
                       std::chrono::seconds(180));
  ASSERT_NE(server.port(), 0) << server.log();
  constexpr int kRequests = 4;
  std::vector<json> answers(kRequests);
  std::vector<int> statuses(kRequests, 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back([&, i] {
      answers[static_cast<size_t>(i)] =
          post(server.port(), "/v1/completions", {{"prompt", {1}}, {"max_tokens", 256}, {"temperature", 0}},
               &statuses[static_cast<size_t>(i)]);
    });
  }
  for (auto& c : clients) c.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_EQ(statuses[static_cast<size_t>(i)], 200) << answers[static_cast<size_t>(i)].dump();
    EXPECT_EQ(answers[static_cast<size_t>(i)]["choices"][0]["text"], golden_text()) << i;
  }
  const std::string m = testing::http_request(server.port(), "GET", "/metrics").body;
  for (const char* engine : {"0", "1"}) {
    const std::string labels = std::string("{model_name=\"stories\",engine=\"") + engine + "\"}";
    EXPECT_GT(metric(m, "vllm:generation_tokens_total" + labels), 0) << m;
    // The draft is the model itself: greedy drafts are all accepted.
    const double drafted = metric(m, "vllm:spec_decode_num_draft_tokens_total" + labels);
    EXPECT_GT(drafted, 0) << engine << "\n" << m;
    EXPECT_EQ(metric(m, "vllm:spec_decode_num_accepted_tokens_total" + labels), drafted) << engine;
  }
}

// The same under mpirun (two MPI ranks, one replica each: rank 0 drives replica 1 over a
// communicator of its own, MPI_Comm_create_group): served, golden, both replicas used.
// `pagoda` under `mpirun -np 2` over TCP loopback, as ServerProcess starts binaries: a script in a
// folder of its own, removed with it.
struct MpirunLauncher {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("pagoda-mpirun-" + std::to_string(getpid()));
  std::string path = (dir / "mpirun-2.sh").string();
  std::vector<std::pair<std::string, std::string>> env = {
      {"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}, {"ASAN_OPTIONS", "detect_leaks=0"}};
  MpirunLauncher() {
    std::filesystem::create_directories(dir);
    std::ofstream sh(path);
    sh << "#!/bin/sh\nexec " << MPIEXEC << " --mca btl self,tcp --mca btl_tcp_if_include lo -np 2 " << PAGODA_BINARY
       << " \"$@\"\n";
    sh.close();
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  }
  ~MpirunLauncher() { std::filesystem::remove_all(dir); }
};

// The pid of MPI rank `rank` among the children of `mpirun` (its OMPI_COMM_WORLD_RANK), or -1.
int mpi_rank_pid(int mpirun, int rank) {
  for (int pid : children_of(mpirun)) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/environ");
    std::string environ((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (environ.find(std::string("OMPI_COMM_WORLD_RANK=") + std::to_string(rank) + '\0') != std::string::npos) return pid;
  }
  return -1;
}

TEST(Server, DataParallelUnderMpirun) {
  PAGODA_TEST_FILE(model_path, "stories260K/stories260K.gguf");
  MpirunLauncher mpirun;
  ServerProcess server(mpirun.path, stories_args(model_path, {"--data-parallel-size", "2"}), std::chrono::seconds(180),
                       mpirun.env);
  ASSERT_NE(server.port(), 0);
  const uint16_t port = server.port();
  std::vector<json> answers(4);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < answers.size(); ++i) {
    clients.emplace_back([&, i] {
      answers[i] = post(port, "/v1/completions", {{"prompt", {1}}, {"max_tokens", 256}, {"temperature", 0}});
    });
  }
  for (auto& c : clients) c.join();
  for (const json& a : answers) EXPECT_EQ(a["choices"][0]["text"], golden_text()) << a.dump();
  const std::string m = testing::http_request(port, "GET", "/metrics").body;
  EXPECT_GT(metric(m, "vllm:generation_tokens_total{model_name=\"stories\",engine=\"0\"}"), 0) << m;
  EXPECT_GT(metric(m, "vllm:generation_tokens_total{model_name=\"stories\",engine=\"1\"}"), 0) << m;
  // mpirun passes SIGTERM on and ends the job (its own status says so, not ours); rank 0 drains
  // and stops first.
  server.send_signal(SIGTERM);
  EXPECT_TRUE(server.wait_exit(std::chrono::seconds(30)).has_value()) << server.log();
  EXPECT_NE(server.log().find("[serve] stopped"), std::string::npos) << server.log();
}

// A slow-model server under mpirun -np 2 with `flags` and --distributed-timeout-seconds 2, two
// streams decoding; MPI rank 1 stopped (SIGSTOP: alive, never answering): the second stream ends
// with a server_error, the job ends within `within`, and the log has `words`.
void expect_stopped_rank_under_mpirun_fails_the_server(std::vector<std::string> flags, const std::string& words,
                                                       std::chrono::seconds within) {
  PAGODA_TEST_FILE(tok, "vocab/ggml-vocab-llama-spm.gguf");
  MpirunLauncher mpirun;
  flags.insert(flags.end(), {"--distributed-timeout-seconds", "2"});
  ServerProcess server(mpirun.path, slow_args(tok, flags), std::chrono::seconds(180), mpirun.env);
  ASSERT_NE(server.port(), 0);
  const uint16_t port = server.port();
  const int rank1 = mpi_rank_pid(server.pid(), 1);
  ASSERT_GT(rank1, 0) << server.log();
  const json req = {{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}};
  SseClient first(port, "/v1/completions", req.dump());
  ASSERT_EQ(first.status(), 200);
  ASSERT_TRUE(first.next().has_value());
  SseClient second(port, "/v1/completions", req.dump());
  ASSERT_EQ(second.status(), 200);
  ASSERT_TRUE(second.next().has_value());
  const auto stopped = Clock::now();
  ASSERT_EQ(kill(rank1, SIGSTOP), 0);
  expect_stream_ends_with_server_error(second);
  EXPECT_TRUE(server.wait_exit(std::chrono::seconds(30)).has_value()) << server.log();
  EXPECT_LT(Clock::now() - stopped, within);
  EXPECT_NE(server.log().find(words), std::string::npos) << server.log();
  kill(rank1, SIGKILL);  // mpirun ends it; never left behind stopped
}

// Under mpirun, a replica's rank that hangs fails rank 0's wait for its step's output after the
// timeout (the second stream runs on replica 1: replica 0 is busy with the first).
TEST(Server, HungReplicaUnderMpirunFailsTheServer) {
  expect_stopped_rank_under_mpirun_fails_the_server({"--data-parallel-size", "2"},
                                                    "MPI recv with rank 1 on rank 0: no answer within 2000 ms",
                                                    std::chrono::seconds(20));
}

// Under mpirun, a tensor-parallel rank that hangs holds rank 0 inside an MPI all-reduce, which
// cannot time out: the server's watch sees no step end for longer than the timeout (plus 2 s),
// answers the streams with a server_error itself and ends the job.
TEST(Server, HungTensorParallelRankUnderMpirunFailsTheServer) {
  expect_stopped_rank_under_mpirun_fails_the_server({"--tensor-parallel-size", "2"}, "no engine step has ended for",
                                                    std::chrono::seconds(25));
}

// A data-parallel replica's rank killed mid-step fails the server as any rank does: the first
// stream runs on replica 0, the second on replica 1 (the first one being busy); both fail.
TEST(Server, DataParallelReplicaKilledMidStepFailsTheServer) {
  expect_killed_rank_fails_both_streams({"--data-parallel-size", "2"});
}

// A rank that hangs (stopped with SIGSTOP: alive, but it never answers) fails the step after
// --distributed-timeout-seconds: the stream ends with a server_error and the server exits 1,
// its log saying which wait ran out.
TEST(Server, HungRankFailsTheServerAfterTheDistributedTimeout) {
  PAGODA_TEST_FILE(tok, "vocab/ggml-vocab-llama-spm.gguf");
  ServerProcess server(PAGODA_BINARY,
                       slow_args(tok, {"--tensor-parallel-size", "2", "--distributed-timeout-seconds", "2"}));
  ASSERT_NE(server.port(), 0);
  const uint16_t port = server.port();
  const std::vector<int> workers = children_of(server.pid());
  ASSERT_EQ(workers.size(), 1u) << server.log();
  const json req = {{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}};
  SseClient sse(port, "/v1/completions", req.dump());
  ASSERT_EQ(sse.status(), 200);
  ASSERT_TRUE(sse.next().has_value());  // decoding
  const auto stopped = Clock::now();
  ASSERT_EQ(kill(workers[0], SIGSTOP), 0);
  expect_stream_ends_with_server_error(sse);
  EXPECT_EQ(server.wait_exit(std::chrono::seconds(20)), std::optional<int>(1)) << server.log();
  const auto took = Clock::now() - stopped;
  EXPECT_GE(took, std::chrono::seconds(2));
  EXPECT_LT(took, std::chrono::seconds(12));
  EXPECT_NE(server.log().find("no answer within 2000 ms"), std::string::npos) << server.log();
  kill(workers[0], SIGKILL);  // killed with its parent already; never left behind stopped
}

// A step that never returns: /health must not keep saying 200 (the loop makes no progress).
TEST(Server, StuckEngineFailsHealth) {
  START_STORIES(server, {"--fault-injection", "stall-at-step:5", "--health-stall-timeout", "1"});
  EXPECT_EQ(testing::http_request(port, "GET", "/health").status, 200);
  std::thread stuck([&] {
    testing::http_request(port, "POST", "/v1/completions", R"({"prompt": "Hi", "max_tokens": 50})", {},
                          std::chrono::seconds(4));
  });
  HttpResult health = poll_health(port, Clock::now() + std::chrono::seconds(10), 200, /*changes_from=*/true);
  EXPECT_EQ(health.status, 503);
  EXPECT_NE(health.body.find("no progress"), std::string::npos) << health.body;
  // New work is refused at once rather than queued behind the stall.
  const auto t0 = Clock::now();
  HttpResult refused = testing::http_request(port, "POST", "/v1/completions", R"({"prompt": "Hi", "max_tokens": 5})",
                                             {}, std::chrono::seconds(5));
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_NE(refused.body.find("no progress"), std::string::npos) << refused.body;
  EXPECT_EQ(refused.headers["retry-after"], "1");
  stuck.join();
}

// A step that stalls and then completes: /health says 503 while it stalls and 200 again after,
// the request in flight finishes with the text it would have had, and new requests are served.
TEST(Server, StallThatEndsRecovers) {
  START_STORIES(server, {"--fault-injection", "stall-at-step:5:4", "--health-stall-timeout", "1"});
  const std::string body = R"({"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "ignore_eos": true})";
  HttpResult stalled;
  std::thread in_flight([&] {
    stalled = testing::http_request(port, "POST", "/v1/completions", body, {}, std::chrono::seconds(60));
  });
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  HttpResult health = poll_health(port, deadline, 200, /*changes_from=*/true);
  EXPECT_EQ(health.status, 503);
  EXPECT_NE(health.body.find("no progress"), std::string::npos) << health.body;
  health = poll_health(port, deadline, 200);
  EXPECT_EQ(health.status, 200) << health.body;
  in_flight.join();
  ASSERT_EQ(stalled.status, 200) << stalled.body;
  HttpResult after = testing::http_request(port, "POST", "/v1/completions", body);
  ASSERT_EQ(after.status, 200) << after.body;
  const json a = json::parse(stalled.body), b = json::parse(after.body);
  EXPECT_EQ(a["usage"]["completion_tokens"], 40);
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
  EXPECT_TRUE(wait_idle(port, "stories"));
}

}  // namespace
}  // namespace pagoda
