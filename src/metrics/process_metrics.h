// Process metrics with the standard Prometheus client names, read from /proc on each call:
// process_resident_memory_bytes, process_virtual_memory_bytes, process_cpu_seconds_total,
// process_open_fds, process_start_time_seconds.
//
// Linux only: a value whose /proc file cannot be read or parsed is left out of the output (a
// scrape never fails because of it). Thread-safe (no shared state).
#pragma once

#include <optional>
#include <string>

namespace pagoda::metrics {

struct ProcessStats {
  std::optional<double> resident_memory_bytes;
  std::optional<double> virtual_memory_bytes;
  std::optional<double> cpu_seconds;         // user + system
  std::optional<double> open_fds;
  std::optional<double> start_time_seconds;  // since the Unix epoch
};

// Reads the current process' stats from /proc/self (and btime from /proc/stat).
ProcessStats read_process_stats();

// Appends the process metrics present in `stats` to `out`, in exposition format.
void append_process_metrics(std::string& out, const ProcessStats& stats);

// read_process_stats() then append_process_metrics().
void append_process_metrics(std::string& out);

}  // namespace pagoda::metrics
