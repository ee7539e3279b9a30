#include "metrics/process_metrics.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "metrics/exposition.h"

namespace pagoda::metrics {

namespace {

std::optional<double> boot_time_seconds() {
  std::ifstream in("/proc/stat");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("btime ", 0) == 0) {
      try {
        return std::stod(line.substr(6));
      } catch (...) {
        return std::nullopt;
      }
    }
  }
  return std::nullopt;
}

void append_one(std::string& out, const char* name, const char* help, const char* type,
                const std::optional<double>& v) {
  if (!v) return;
  append_header(out, name, help, type);
  append_sample(out, name, {}, {}, *v);
}

}  // namespace

ProcessStats read_process_stats() {
  ProcessStats s;
  const long ticks = sysconf(_SC_CLK_TCK);
  const long page = sysconf(_SC_PAGESIZE);

  // /proc/self/stat: "pid (comm) state f4 f5 ...". comm may hold spaces and ')', so fields are
  // counted from the last ')'. After it, field 3 (state) is index 0: utime=14, stime=15,
  // starttime=22, vsize=23, rss=24 (1-based field numbers from proc(5)).
  std::ifstream in("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close != std::string::npos && ticks > 0 && page > 0) {
    std::istringstream fields(text.substr(close + 1));
    std::vector<std::string> f;
    std::string tok;
    while (fields >> tok) f.push_back(tok);
    auto field = [&](int number) -> std::optional<double> {
      const size_t i = static_cast<size_t>(number - 3);
      if (i >= f.size()) return std::nullopt;
      try {
        return std::stod(f[i]);
      } catch (...) {
        return std::nullopt;
      }
    };
    const auto utime = field(14), stime = field(15), start = field(22);
    const auto vsize = field(23), rss = field(24);
    if (utime && stime) s.cpu_seconds = (*utime + *stime) / static_cast<double>(ticks);
    if (vsize) s.virtual_memory_bytes = *vsize;
    if (rss) s.resident_memory_bytes = *rss * static_cast<double>(page);
    const auto btime = boot_time_seconds();
    if (start && btime) s.start_time_seconds = *btime + *start / static_cast<double>(ticks);
  }

  std::error_code ec;
  double fds = 0;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end;
       it.increment(ec)) {
    ++fds;
  }
  if (!ec) s.open_fds = fds;  // includes the descriptor used to list the directory, as others do
  return s;
}

void append_process_metrics(std::string& out, const ProcessStats& s) {
  append_one(out, "process_virtual_memory_bytes", "Virtual memory size in bytes.", "gauge",
             s.virtual_memory_bytes);
  append_one(out, "process_resident_memory_bytes", "Resident memory size in bytes.", "gauge",
             s.resident_memory_bytes);
  append_one(out, "process_start_time_seconds",
             "Start time of the process since unix epoch in seconds.", "gauge",
             s.start_time_seconds);
  append_one(out, "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
             "counter", s.cpu_seconds);
  append_one(out, "process_open_fds", "Number of open file descriptors.", "gauge", s.open_fds);
}

void append_process_metrics(std::string& out) { append_process_metrics(out, read_process_stats()); }

}  // namespace pagoda::metrics
