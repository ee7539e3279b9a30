#include "kv_transfer/kv_transfer_config.h"

#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace pagoda {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / kGiB);
  return text;
}

}  // namespace

namespace {

Result<KvTransferConfig> parse_object(const nlohmann::json& j, bool part);

}  // namespace

const KvTransferConfig* KvTransferConfig::offloading_part() const {
  if (kv_connector == "OffloadingConnector") return this;
  for (const KvTransferConfig& c : connectors) {
    if (c.kv_connector == "OffloadingConnector") return &c;
  }
  return nullptr;
}

const KvTransferConfig* KvTransferConfig::remote_part() const {
  auto is_remote = [](const KvTransferConfig& c) {
    return c.kv_connector == "TcpConnector" || c.kv_connector == "ShmConnector";
  };
  if (is_remote(*this)) return this;
  for (const KvTransferConfig& c : connectors) {
    if (is_remote(c)) return &c;
  }
  return nullptr;
}

Result<KvTransferConfig> KvTransferConfig::parse(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(std::string("--kv-transfer-config: not valid JSON: ") + e.what());
  }
  return parse_object(j, false);
}

namespace {

Result<KvTransferConfig> parse_object(const nlohmann::json& j, bool part) {
  const auto bad = [part](const std::string& why) {
    return invalid_argument(std::string(part ? "--kv-transfer-config: a MultiConnector part: " : "--kv-transfer-config: ") + why);
  };
  if (!j.is_object()) {
    return bad("must be a JSON object, e.g. {\"kv_connector\": \"OffloadingConnector\", \"kv_role\": \"kv_both\"}");
  }
  KvTransferConfig c;
  nlohmann::json extra = nlohmann::json::object();
  for (const auto& item : j.items()) {
    const std::string& key = item.key();
    const nlohmann::json& value = item.value();
    auto string = [&](std::string* out) -> Status {
      if (!value.is_string()) return bad(key + " must be a string");
      *out = value.get<std::string>();
      return Status::ok_status();
    };
    Status st = Status::ok_status();
    if (key == "kv_connector") {
      st = string(&c.kv_connector);
    } else if (key == "kv_role") {
      st = string(&c.kv_role);
    } else if (key == "engine_id") {
      st = string(&c.engine_id);
    } else if (key == "kv_ip") {
      st = string(&c.kv_ip);
    } else if (key == "kv_port") {
      if (!value.is_number_integer() || value.get<int64_t>() < 1 || value.get<int64_t>() > 65535) {
        return bad("kv_port must be an integer in [1, 65535]");
      }
      c.kv_port = value.get<int>();
    } else if (key == "kv_buffer_size") {
      if (!value.is_number() || !(value.get<double>() >= 1) || value.get<double>() > 9e18) {
        return bad("kv_buffer_size must be a positive number of bytes");
      }
      c.kv_buffer_size = static_cast<int64_t>(value.get<double>());
    } else if (key == "kv_connector_extra_config") {
      if (!value.is_object()) return bad("kv_connector_extra_config must be a JSON object");
      extra = value;
    } else if (key == "kv_parallel_size" || key == "kv_rank" || key == "kv_buffer_device" ||
               key == "kv_connector_module_path" || key == "kv_load_failure_policy") {
      // vLLM's fields for connectors Pagoda does not have; accepted so that vLLM's configs load.
    } else {
      return bad("unknown field '" + key +
                 "' (supported: kv_connector, kv_role, engine_id, kv_ip, kv_port, kv_buffer_size, "
                 "kv_connector_extra_config)");
    }
    if (!st.ok()) return st;
  }
  if (c.kv_connector.empty()) {
    return bad("needs kv_connector (supported: OffloadingConnector, TcpConnector, ShmConnector, MultiConnector)");
  }
  if (c.kv_role != "kv_producer" && c.kv_role != "kv_consumer" && c.kv_role != "kv_both") {
    return bad("kv_role must be kv_producer, kv_consumer or kv_both, got '" + c.kv_role + "'");
  }
  if (c.kv_connector == "MultiConnector") {
    if (part) return bad("a MultiConnector inside a MultiConnector");
    const auto list = extra.find("connectors");
    if (list == extra.end() || !list->is_array() || list->empty()) {
      return bad("MultiConnector needs kv_connector_extra_config.connectors, a list of connector objects");
    }
    for (const nlohmann::json& one : *list) {
      if (!one.is_object()) return bad("MultiConnector's connectors must be JSON objects");
      PAGODA_ASSIGN_OR_RETURN(KvTransferConfig p, parse_object(one, true));
      c.connectors.push_back(std::move(p));
    }
    int offloading = 0, remote = 0;
    for (const KvTransferConfig& p : c.connectors) {
      offloading += p.kv_connector == "OffloadingConnector";
      remote += p.kv_connector != "OffloadingConnector";
    }
    if (offloading > 1 || remote > 1) {
      return bad("MultiConnector takes at most one OffloadingConnector and one TcpConnector or ShmConnector");
    }
    return c;
  }
  if (c.kv_connector == "TcpConnector" || c.kv_connector == "ShmConnector") {
    // Other connectors' extra options (vLLM's P2P proxy addresses, ...) mean nothing here.
    if (const auto peers = extra.find("prefill_peers"); peers != extra.end()) {
      if (!peers->is_array()) return bad("kv_connector_extra_config.prefill_peers must be a list of \"host:port\"");
      for (const nlohmann::json& p : *peers) {
        if (!p.is_string() || p.get<std::string>().find(':') == std::string::npos) {
          return bad("kv_connector_extra_config.prefill_peers must be a list of \"host:port\"");
        }
        c.prefill_peers.push_back(p.get<std::string>());
      }
    }
    if (c.kv_role == "kv_both" && c.kv_port == 0) return bad("kv_port must be given");
    if (c.engine_id.empty()) c.engine_id = c.kv_ip + ":" + std::to_string(c.kv_port);
    return c;
  }
  if (c.kv_connector != "OffloadingConnector") {
    return bad("kv_connector '" + c.kv_connector +
               "' is not supported (supported: OffloadingConnector, TcpConnector, ShmConnector, MultiConnector)");
  }
  for (const auto& item : extra.items()) {
    const std::string& key = item.key();
    const nlohmann::json& value = item.value();
    auto bytes = [&](int64_t* out) -> Status {
      if (!value.is_number() || !(value.get<double>() >= 1) || value.get<double>() > 9e18) {
        return bad("kv_connector_extra_config." + key + " must be a positive number");
      }
      *out = static_cast<int64_t>(value.get<double>());
      return Status::ok_status();
    };
    Status st = Status::ok_status();
    if (key == "cpu_bytes_to_use") {
      st = bytes(&c.cpu_bytes_to_use);
    } else if (key == "num_cpu_blocks") {
      st = bytes(&c.num_cpu_blocks);
    } else if (key == "disk_bytes_to_use") {
      st = bytes(&c.disk_bytes_to_use);
    } else if (key == "disk_path") {
      if (!value.is_string() || value.get<std::string>().empty()) {
        return bad("kv_connector_extra_config.disk_path must be a non-empty string (a directory)");
      }
      c.disk_path = value.get<std::string>();
    } else if (key == "block_size" || key == "spec_name" || key == "spec_module_path") {
      // vLLM's OffloadingConnector options: the tier's blocks are the KV cache's here.
    } else {
      return bad("unknown kv_connector_extra_config field '" + key +
                 "' for OffloadingConnector (supported: cpu_bytes_to_use, num_cpu_blocks, disk_path, "
                 "disk_bytes_to_use)");
    }
    if (!st.ok()) return st;
  }
  if (c.cpu_bytes_to_use == 0 && c.num_cpu_blocks == 0) {
    return bad("OffloadingConnector needs kv_connector_extra_config.cpu_bytes_to_use (or num_cpu_blocks), or use "
               "--kv-offloading-size GiB");
  }
  if (c.cpu_bytes_to_use > 0 && c.num_cpu_blocks > 0) {
    return bad("give cpu_bytes_to_use or num_cpu_blocks, not both");
  }
  return c;
}

}  // namespace

Result<KvTransferConfig> KvTransferConfig::offloading(double size_gib) {
  if (!(size_gib > 0) || !std::isfinite(size_gib) || size_gib * kGiB > 9e18) {
    return invalid_argument("--kv-offloading-size must be a positive number of GiB");
  }
  KvTransferConfig c;
  c.kv_connector = "OffloadingConnector";
  c.cpu_bytes_to_use = static_cast<int64_t>(size_gib * kGiB);
  return c;
}

std::string KvTransferConfig::describe() const {
  if (!connectors.empty()) {
    std::string text = kv_connector + " of ";
    for (size_t i = 0; i < connectors.size(); ++i) text += (i > 0 ? " and " : "") + connectors[i].describe();
    return text;
  }
  if (remote()) {
    return kv_connector + " (" + kv_role + ", engine " + engine_id + ", " + kv_ip + ":" + std::to_string(kv_port) + ")";
  }
  if (!offloading()) return kv_connector;
  std::string text = kv_connector + " (host tier ";
  text += cpu_bytes_to_use > 0 ? gib(cpu_bytes_to_use) : std::to_string(num_cpu_blocks) + " blocks";
  if (!disk_path.empty()) {
    text += ", disk " + disk_path + (disk_bytes_to_use > 0 ? " up to " + gib(disk_bytes_to_use) : "");
  }
  return text + ")";
}

}  // namespace pagoda
