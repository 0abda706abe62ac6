#include "engine/planner/calibration.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "parallel/communicator.h"

namespace tessera::planner {

using nlohmann::json;

namespace {

std::string now_text() {
  char text[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  return text;
}

at::ScalarType dtype_of(const std::string& precision) {
  return precision == "bf16" ? at::kBFloat16 : precision == "fp16" ? at::kHalf : at::kFloat;
}

json read_cache(const std::string& path) {
  if (path.empty()) return json::object();  // no cache: the defaults or the given rates
  std::ifstream in(path);
  if (!in) return json::object();
  try {
    json j = json::parse(in);
    return j.is_object() ? j : json::object();
  } catch (...) {
    return json::object();  // a damaged cache is measured again
  }
}

// Whole or not at all: a half-written cache would be read as damaged and measured again.
bool write_cache(const std::string& path, const json& cache) {
  if (path.empty()) return false;  // no cache
  std::error_code ignored;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ignored);
  const std::string partial = path + ".partial." + std::to_string(getpid());
  {
    std::ofstream out(partial);
    out << cache.dump(2) << "\n";
    if (!out) return false;
  }
  std::filesystem::rename(partial, path, ignored);
  return !ignored;
}

constexpr const char* kInterNode = "inter_node";  // the cache's entry for tessera probe-link

}  // namespace

std::string default_calibration_cache() {
  const char* dir = std::getenv("TESSERA_CACHE_DIR");
  if (dir && *dir) return std::string(dir) + "/calibration.json";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/tessera/calibration.json";
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  return "unknown";
}

int online_cores() {
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? int(n) : 1;
}

double Calibration::core_share() const {
  if (device != "cpu" || cores_per_node <= 0 || ranks_per_node <= cores_per_node) return 1.0;
  return double(cores_per_node) / double(ranks_per_node);
}

double Calibration::roofline_seconds(double flops, double bytes) const {
  return std::max(flops / (tflops.value * 1e12), bytes / (device_memory_gbps.value * 1e9));
}

namespace {

// A layer's cache key: its shape and how many ranks on how many cores ran it together.
std::string layer_key(const LayerShape& shape, int ranks, int cores) {
  return shape.key() + " x" + std::to_string(ranks) + "/" + std::to_string(cores) + "cores";
}

}  // namespace

void Calibration::time_layers(const std::vector<LayerShape>& shapes) const {
  if (!probe_) return;
  // Timed with as many threads as the node has ranks (they contend for its cores, caches and
  // memory), then counted back to a core of its own (× the core share): the step-cost model
  // shares the cores itself (shared_cores.h).
  const int together = std::max(1, ranks_per_node);
  std::vector<LayerShape> missing;
  std::vector<std::string> keys;
  for (const LayerShape& shape : shapes) {
    const std::string key = layer_key(shape, together, cores_per_node);
    if (layers_.count(key) || std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
    missing.push_back(shape);
    keys.push_back(key);
  }
  if (missing.empty()) return;
  const std::vector<double> seconds = planner::time_layers(missing, dtype_of(precision), together, cores_per_node);
  for (size_t i = 0; i < missing.size(); ++i) layers_[keys[i]] = seconds[i] * core_share();
  timed_now_ += int(missing.size());
}

std::optional<double> Calibration::layer_seconds(const LayerShape& shape) const {
  if (!probe_) return std::nullopt;
  time_layers({shape});
  return layers_.at(layer_key(shape, std::max(1, ranks_per_node), cores_per_node));
}

double Calibration::linear_seconds(int64_t rows, int64_t k, int64_t n) const {
  if (rows <= 0 || k <= 0 || n <= 0) return 0.0;
  if (probe_) {
    const std::string key = std::to_string(rows) + "," + std::to_string(k) + "," + std::to_string(n);
    auto it = linears_.find(key);
    if (it == linears_.end()) {
      it = linears_.emplace(key, time_linear(rows, k, n, dtype_of(precision))).first;
      ++timed_now_;
    }
    return it->second;
  }
  const double r = double(rows), K = double(k), N = double(n), c = precision == "fp32" ? 4.0 : 2.0;
  return 3 * roofline_seconds(2 * r * K * N, (r * K + K * N + r * N) * c);
}

double Calibration::collective_seconds(Collective kind, double bytes, int ranks, bool spans_nodes,
                                       bool between_compute) const {
  if (ranks < 2) return 0.0;
  const double probed = collective_gbps_[int(kind)];
  const double gbps = spans_nodes ? inter_node_gbps.value : probed > 0 ? probed : intra_node_gbps.value;
  const double ring = double(ranks - 1) / ranks * bytes * (kind == Collective::all_reduce ? 2 : 1);
  return latency_seconds(ranks, spans_nodes, between_compute) + ring / (gbps * 1e9);
}

double Calibration::latency_seconds(int ranks, bool spans_nodes, bool between_compute) const {
  double latency = collective_latency_us.value;
  if (between_compute && !spans_nodes) {
    // The probe's group of that size, or the next larger one it timed.
    const auto it = synced_latency_us_.lower_bound(ranks);
    if (it != synced_latency_us_.end()) latency = std::max(latency, it->second);
  }
  return latency * 1e-6;
}

json Calibration::to_json() const {
  json j = {{"device", device}, {"ranks_per_node", ranks_per_node}, {"precision", precision}, {"probe", probe_}};
  if (emulated_hosts) j["emulated_hosts"] = true;
  if (probe_) j["shapes_timed"] = layers_.size() + linears_.size(), j["shapes_timed_now"] = timed_now_;
  if (cores_per_node > 0) j["cores_per_node"] = cores_per_node, j["core_share_per_rank"] = core_share();
  auto put = [&](const char* key, const Rate& r) { j[key] = {{"value", r.value}, {"source", r.source}}; };
  put("tflops", tflops);
  put("intra_node_gbps", intra_node_gbps);
  put("inter_node_gbps", inter_node_gbps);
  put("host_memory_gbps", host_memory_gbps);
  put("device_memory_gbps", device_memory_gbps);
  put("pcie_gbps", pcie_gbps);
  put("nvme_gbps", nvme_gbps);
  put("collective_latency_us", collective_latency_us);
  put("overlap_exposed", overlap_exposed);
  for (const auto& [g, us] : synced_latency_us_) j["synced_latency_us"][std::to_string(g)] = us;
  if (collective_gbps_[0] > 0)
    j["intra_node_collectives_gbps"] = {{"reduce_scatter", collective_gbps_[0]}, {"all_gather", collective_gbps_[1]},
                                        {"all_reduce", collective_gbps_[2]}};
  return j;
}

std::string Calibration::describe() const {
  std::ostringstream out;
  auto line = [&](const char* what, const Rate& r, const char* unit) {
    char value[32];
    std::snprintf(value, sizeof value, "%.4g", r.value);
    out << "  " << what << ": " << value << " " << unit << " (" << r.source << ")\n";
  };
  line(device == "cpu" ? "compute per core" : "compute per GPU", tflops, "TFLOP/s");
  if (probe_)
    out << "    layers and linear layers timed forward + backward at each layout's shapes: "
        << layers_.size() + linears_.size() << " shapes, " << timed_now_ << " timed now, the rest " << layer_source_ << "\n";
  if (emulated_hosts)
    out << "    the " << ranks_per_node << " ranks' hosts are emulated on this machine: they share its cores, memory and disk\n";
  if (core_share() < 1)
    out << "    " << ranks_per_node << " ranks share " << cores_per_node << " cores: a rank's work takes 1/" << core_share()
        << " as long, but one idle in a pipeline bubble leaves its core to the others\n";
  line("links inside a node", intra_node_gbps, "GB/s");
  if (collective_gbps_[0] > 0) {
    char rates[128];
    std::snprintf(rates, sizeof rates, "reduce-scatter %.3g, all-gather %.3g, allreduce %.3g GB/s",
                  collective_gbps_[0], collective_gbps_[1], collective_gbps_[2]);
    out << "    each collective alone (bus bandwidth, same source): " << rates << "\n";
  }
  line("links between nodes", inter_node_gbps, "GB/s");
  line("collective latency", collective_latency_us, "us");
  if (!synced_latency_us_.empty()) {
    out << "    between compute segments on every rank (tensor parallelism's, same source):";
    const char* sep = " ";
    for (const auto& [g, us] : synced_latency_us_) {
      char text[64];
      std::snprintf(text, sizeof text, "%s%d ranks %.0f us", sep, g, us);
      out << text;
      sep = ", ";
    }
    out << "\n";
  }
  line("share of an overlapped collective still paid", overlap_exposed, "");
  line("optimizer step memory bandwidth per rank", device_memory_gbps, "GB/s");
  line("host memory per node", host_memory_gbps, "GB/s");
  line("host <-> device", pcie_gbps, "GB/s");
  line("NVMe per node", nvme_gbps, "GB/s");
  return out.str();
}

void Calibration::save() const {
  if (!probe_ || cache_path_.empty() || timed_now_ == 0) return;  // nothing new, or no cache
  json cache = read_cache(cache_path_);
  json& entry = cache[cache_key_];
  if (!entry.is_object()) entry = json::object();
  for (const auto& [k, v] : layers_) entry["layers"][k] = v;
  for (const auto& [k, v] : linears_) entry["linears"][k] = v;
  write_cache(cache_path_, cache);  // one that cannot be written is measured again next time
}

bool save_inter_node_probe(const std::string& cache_path, const LinkProbe& probe, const std::string& across) {
  json cache = read_cache(cache_path);
  cache[kInterNode] = {{"bus_gbps", probe.bus_gbps}, {"latency_us", probe.latency_us}, {"across", across},
                       {"date", now_text()}};
  return write_cache(cache_path, cache);
}

Calibration Calibration::from(const Hardware& hw, const std::string& precision, const json& request, bool measure,
                              const std::string& cache_path) {
  Calibration c;
  c.device = hw.device;
  c.precision = precision;
  c.emulated_hosts = request.contains("emulated_hosts") && request["emulated_hosts"].is_boolean() &&
                     request["emulated_hosts"].get<bool>();
  c.ranks_per_node = c.emulated_hosts ? hw.gpus_per_node * hw.nodes : hw.gpus_per_node;
  const bool cpu = hw.device == "cpu";
  auto given = [&](const char* key) { return request.contains(key) && !request[key].is_null(); };
  if (cpu) c.cores_per_node = given("cores_per_node") ? request["cores_per_node"].get<int>() : online_cores();
  auto rate = [&](Rate& r, const char* key, double value, const std::string& fallback) {
    r.value = value;
    r.source = given(key) ? "given" : "default (" + fallback + ")";
  };
  const std::string what = cpu ? "a CPU rank over Gloo" : "an A100-80GB-class node";
  rate(c.tflops, "gpu_tflops", hw.gpu_tflops, what);
  rate(c.intra_node_gbps, "intra_node_bw", hw.intra_node_gbps, what);
  rate(c.inter_node_gbps, "inter_node_bw", hw.inter_node_gbps, what);
  rate(c.host_memory_gbps, "host_mem_bw", hw.host_memory_gbps, what);
  rate(c.pcie_gbps, "pcie_bw", hw.pcie_gbps, what);
  rate(c.nvme_gbps, "nvme_bw", hw.nvme_gbps, "one NVMe drive");
  // GPU: an A100's HBM (2 TB/s peak, ~1.5 reached by a fused Adam); CPU ranks: the node's memory
  // bandwidth, shared by its ranks when they step together.
  rate(c.device_memory_gbps, "device_memory_bw",
       given("device_memory_bw") ? request["device_memory_bw"].get<double>() : cpu ? hw.host_memory_gbps / hw.gpus_per_node : 1500,
       cpu ? "the host's bandwidth over its ranks" : "an A100's HBM");
  rate(c.overlap_exposed, "overlap_exposed", given("overlap_exposed") ? request["overlap_exposed"].get<double>() : cpu ? 0.85 : 0.0,
       cpu ? "Gloo's copies and sums share the ranks' cores: ZeRO-3 on 4 CPU ranks, docs/benchmarks.md"
           : "NCCL on its own channels");
  rate(c.collective_latency_us, "collective_latency_us",
       given("collective_latency_us") ? request["collective_latency_us"].get<double>() : cpu ? 100 : 20,
       cpu ? "Gloo on one host" : "NCCL inside a node");
  if (!cpu) return c;

  // CPU ranks: the probe, now or cached.
  c.cache_path_ = cache_path;
  c.cache_key_ = cpu_model_name() + " / " + precision;
  const json cache = read_cache(cache_path);
  if (cache.contains(kInterNode) && cache[kInterNode].is_object() && !given("inter_node_bw")) {
    const json& e = cache[kInterNode];
    if (e.value("bus_gbps", 0.0) > 0)
      c.inter_node_gbps = {e.value("bus_gbps", 0.0), "cached (" + cache_path + ", " + e.value("date", "") +
                                                          "): tessera probe-link, Gloo reduce-scatter + all-gather " +
                                                          e.value("across", std::string("across hosts"))};
  }
  const std::string links = std::to_string(c.ranks_per_node) + " ranks on " + std::to_string(c.cores_per_node) + " cores";
  // The node's ranks step their optimizers at once: the memory bandwidth as that many cores (at
  // most the ranks) copy together.
  const int copiers = std::max(1, std::min(c.ranks_per_node, c.cores_per_node));
  int memory_threads = copiers;
  double one_thread_tflops = 0, memory_gbps = 0;
  std::optional<LinkProbe> link;
  bool processes = true;  // a cache from before the probe forked its ranks timed threads
  std::string source;
  if (measure) {
    source = "measured now";
    one_thread_tflops = 6.0 * 1024 * 1024 * 1024 / time_linear(1024, 1024, 1024, dtype_of(precision)) / 1e12;
    memory_gbps = time_copy_gbps(copiers);
    if (c.ranks_per_node > 1) link = time_gloo(c.ranks_per_node, int64_t(32) << 20, c.cores_per_node);
    json entry = cache.contains(c.cache_key_) ? cache[c.cache_key_] : json::object();
    entry["date"] = now_text();
    entry["tflops_one_thread"] = one_thread_tflops;
    entry["host_memory_gbps"] = memory_gbps;
    entry["host_memory_threads"] = copiers;
    if (link) {
      json& l = entry["links"][links];
      l = {{"bus_gbps", link->bus_gbps}, {"latency_us", link->latency_us},
           {"reduce_scatter_gbps", link->reduce_scatter_gbps}, {"all_gather_gbps", link->all_gather_gbps},
           {"all_reduce_gbps", link->all_reduce_gbps}, {"processes", true}};
      for (const auto& [g, us] : link->synced_latency_us) l["synced_latency_us"][std::to_string(g)] = us;
    }
    entry.erase("layers"), entry.erase("linears");  // timed again, now
    json updated = cache;
    updated[c.cache_key_] = entry;
    write_cache(cache_path, updated);
  } else if (cache.contains(c.cache_key_)) {
    const json& e = cache[c.cache_key_];
    source = "cached (" + cache_path + ", " + e.value("date", "") + ")";
    one_thread_tflops = e.value("tflops_one_thread", 0.0);
    memory_gbps = e.value("host_memory_gbps", 0.0);
    memory_threads = e.value("host_memory_threads", 1);
    if (e.contains("links") && e["links"].contains(links)) {
      const json& l = e["links"][links];
      link = LinkProbe{l.value("bus_gbps", 0.0), l.value("latency_us", 0.0), l.value("reduce_scatter_gbps", 0.0),
                       l.value("all_gather_gbps", 0.0), l.value("all_reduce_gbps", 0.0), {}};
      if (l.contains("synced_latency_us") && l["synced_latency_us"].is_object())
        for (const auto& [g, us] : l["synced_latency_us"].items()) link->synced_latency_us[std::stoi(g)] = us.get<double>();
      processes = l.value("processes", false);
    }
    if (e.contains("layers")) c.layers_ = e["layers"].get<std::map<std::string, double>>();
    if (e.contains("linears")) c.linears_ = e["linears"].get<std::map<std::string, double>>();
  } else {
    return c;  // the defaults; --measure probes
  }
  if (!(one_thread_tflops > 0) || !(memory_gbps > 0)) return c;
  c.probe_ = !given("gpu_tflops");
  c.layer_source_ = source;
  if (!given("gpu_tflops"))
    c.tflops = {one_thread_tflops, source + ": a 1024^3 " + precision + " linear layer, one thread"};
  if (!given("host_mem_bw"))
    c.host_memory_gbps = {memory_gbps, source + ": 256 MiB copied by " + std::to_string(memory_threads) +
                                           (memory_threads == 1 ? " thread" : " threads at once")};
  const std::string among = (processes ? "" : "threads of one process: ") + links;
  if (link && !given("intra_node_bw")) {
    c.intra_node_gbps = {link->bus_gbps, source + ": Gloo reduce-scatter + all-gather of 32 MiB among " + among};
    c.collective_gbps_[0] = link->reduce_scatter_gbps;
    c.collective_gbps_[1] = link->all_gather_gbps;
    c.collective_gbps_[2] = link->all_reduce_gbps;
  }
  if (link && !given("collective_latency_us")) {
    c.collective_latency_us = {link->latency_us, source + ": Gloo allreduce of one element among " + among};
    c.synced_latency_us_ = link->synced_latency_us;
  }
  if (!given("device_memory_bw"))
    c.device_memory_gbps = {c.host_memory_gbps.value / c.ranks_per_node,
                            "the host's bandwidth over its " + std::to_string(c.ranks_per_node) + " ranks"};
  if (!given("pcie_bw")) c.pcie_gbps = {c.host_memory_gbps.value, "host memory (CPU ranks copy within it)"};
  return c;
}

}  // namespace tessera::planner
