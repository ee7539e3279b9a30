// `pagoda proxy --prefill URL... --decode URL... --port N`: serves the OpenAI API in front of
// prefill instances (--kv-transfer-config kv_role kv_producer) and decode instances (kv_consumer)
// until SIGINT / SIGTERM (server/disagg_proxy.h says how a request goes through them).
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "apps/pagoda/commands.h"
#include "base/log.h"
#include "server/disagg_proxy.h"

namespace pagoda::app {

void ProxyFlags::add_to(CLI::App& cmd) {
  cmd.add_option("--prefill", prefill, "a prefill instance, http://host:port (repeat, or separate with commas)")
      ->required()
      ->delimiter(',');
  cmd.add_option("--decode", decode, "a decode instance, http://host:port (repeat, or separate with commas)")
      ->required()
      ->delimiter(',');
  cmd.add_option("--host", host, "address to listen on")->capture_default_str();
  cmd.add_option("--port", port, "port to listen on")->capture_default_str();
  cmd.add_option("--timeout", timeout, "seconds one read from an instance may wait")->capture_default_str();
}

int run_proxy(const ProxyFlags& flags) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // every thread started below inherits it
  server::ProxyConfig config;
  config.prefill_urls = flags.prefill;
  config.decode_urls = flags.decode;
  config.host = flags.host;
  config.port = flags.port;
  if (!(flags.timeout > 0 && flags.timeout <= 86400)) {
    std::fprintf(stderr, "pagoda: error: --timeout must be in (0, 86400] seconds\n");
    return 1;
  }
  config.io_timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.timeout * 1000));
  auto proxy = server::DisaggProxy::start(config);
  if (!proxy.ok()) {
    std::fprintf(stderr, "pagoda: error: %s\n", proxy.status().message().c_str());
    return 1;
  }
  log_line(LogLevel::kInfo, "proxy",
           "listening on http://" + flags.host + ":" + std::to_string((*proxy)->port()) + " with " +
               std::to_string(flags.prefill.size()) + " prefill and " + std::to_string(flags.decode.size()) +
               " decode instance(s)");
  int sig = 0;
  sigwait(&signals, &sig);
  log_line(LogLevel::kInfo, "proxy", "stopping");
  (*proxy)->stop();
  return 0;
}

}  // namespace pagoda::app
