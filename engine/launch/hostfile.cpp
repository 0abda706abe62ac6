// DeepSpeed's hostfile and its filters (engine/launch/hostfile.h).
#include "engine/launch/hostfile.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "engine/config/config_io.h"

namespace tessera {

namespace {

std::string trim(const std::string& s) {
  size_t begin = s.find_first_not_of(" \t\r");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t\r") + 1 - begin);
}

std::optional<int> whole_number(const std::string& text) {
  if (text.empty() || text.size() > 9 || !std::all_of(text.begin(), text.end(), ::isdigit)) return std::nullopt;
  return std::stoi(text);
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, separator);) parts.push_back(part);
  if (!text.empty() && text.back() == separator) parts.push_back("");
  return parts;
}

// "worker-1:0,1@worker-2" -> {worker-1: [0, 1], worker-2: []} (empty: every slot), in order.
std::vector<std::pair<std::string, std::vector<int>>> parse_filter(const std::string& filter, const char* flag) {
  std::vector<std::pair<std::string, std::vector<int>>> out;
  if (filter.empty()) return out;
  for (const std::string& item : split(filter, '@')) {
    size_t colon = item.find(':');
    std::string host = item.substr(0, colon);
    if (host.empty())
      throw ConfigError(std::string(flag) + " \"" + filter + "\": expected HOST[:SLOT,SLOT...]@HOST..., found an empty host");
    std::vector<int> slots;
    if (colon != std::string::npos)
      for (const std::string& s : split(item.substr(colon + 1), ',')) {
        auto slot = whole_number(s);
        if (!slot)
          throw ConfigError(std::string(flag) + " \"" + filter + "\": slot \"" + s + "\" of " + host +
                            " is not a number");
        slots.push_back(*slot);
      }
    out.emplace_back(host, slots);
  }
  return out;
}

HostSlots* find_host(std::vector<HostSlots>& hosts, const std::string& name, const char* flag) {
  for (auto& h : hosts)
    if (h.host == name) return &h;
  throw ConfigError(std::string(flag) + ": host \"" + name + "\" is not in the hostfile");
}

void check_slots(const HostSlots& h, const std::vector<int>& slots, const char* flag) {
  for (int s : slots)
    if (std::find(h.slots.begin(), h.slots.end(), s) == h.slots.end())
      throw ConfigError(std::string(flag) + ": host \"" + h.host + "\" has slots 0.." +
                        std::to_string(h.slots.size() - 1) + ", not " + std::to_string(s));
}

}  // namespace

std::vector<HostSlots> parse_hostfile(const std::string& text, const std::string& source) {
  std::vector<HostSlots> hosts;
  std::stringstream in(text);
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    const std::string where = source + ":" + std::to_string(number) + ": ";
    std::stringstream words(line);
    std::string host, slots_word, extra;
    words >> host >> slots_word >> extra;
    std::optional<int> slots;
    if (slots_word.rfind("slots=", 0) == 0) slots = whole_number(slots_word.substr(6));
    if (!slots || *slots < 1 || !extra.empty())
      throw ConfigError(where + "expected \"HOST slots=N\" (N >= 1), found \"" + line + "\"");
    for (const auto& h : hosts)
      if (h.host == host) throw ConfigError(where + "host \"" + host + "\" is listed twice");
    HostSlots h{host, {}};
    for (int s = 0; s < *slots; ++s) h.slots.push_back(s);
    hosts.push_back(h);
  }
  if (hosts.empty()) throw ConfigError(source + ": no hosts (expected lines \"HOST slots=N\")");
  return hosts;
}

std::vector<HostSlots> read_hostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("hostfile " + path + ": cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  return parse_hostfile(text.str(), path);
}

std::vector<HostSlots> select_hosts(const std::vector<HostSlots>& hosts, const std::string& include,
                                    const std::string& exclude, std::optional<int> num_nodes,
                                    std::optional<int> num_gpus) {
  if (!include.empty() && !exclude.empty()) throw ConfigError("--include and --exclude cannot be used together");
  if ((!include.empty() || !exclude.empty()) && (num_nodes || num_gpus))
    throw ConfigError("--num_nodes/--num_gpus cannot be used with --include/--exclude (as with DeepSpeed)");
  std::vector<HostSlots> all = hosts;
  std::vector<HostSlots> chosen;
  if (!include.empty()) {
    for (const auto& [name, slots] : parse_filter(include, "--include")) {
      HostSlots* h = find_host(all, name, "--include");
      check_slots(*h, slots, "--include");
      for (const auto& c : chosen)
        if (c.host == name) throw ConfigError("--include: host \"" + name + "\" is named twice");
      HostSlots picked{name, slots.empty() ? h->slots : slots};
      std::sort(picked.slots.begin(), picked.slots.end());
      picked.slots.erase(std::unique(picked.slots.begin(), picked.slots.end()), picked.slots.end());
      chosen.push_back(picked);
    }
    // The hostfile's order, not the filter's, decides the node ranks.
    std::stable_sort(chosen.begin(), chosen.end(), [&](const HostSlots& a, const HostSlots& b) {
      auto index = [&](const std::string& n) {
        return std::find_if(hosts.begin(), hosts.end(), [&](const HostSlots& h) { return h.host == n; }) - hosts.begin();
      };
      return index(a.host) < index(b.host);
    });
  } else {
    for (const auto& [name, slots] : parse_filter(exclude, "--exclude")) {
      HostSlots* h = find_host(all, name, "--exclude");
      check_slots(*h, slots, "--exclude");
      if (slots.empty()) h->slots.clear();
      for (int s : slots) h->slots.erase(std::remove(h->slots.begin(), h->slots.end(), s), h->slots.end());
    }
    for (const auto& h : all)
      if (!h.slots.empty()) chosen.push_back(h);
    if (num_nodes) {
      if (*num_nodes > int(chosen.size()))
        throw ConfigError("--num_nodes " + std::to_string(*num_nodes) + ": the hostfile has " +
                          std::to_string(chosen.size()) + " host(s)");
      chosen.resize(size_t(*num_nodes));
    }
    if (num_gpus)
      for (auto& h : chosen) {
        if (*num_gpus > int(h.slots.size()))
          throw ConfigError("--num_gpus " + std::to_string(*num_gpus) + ": host \"" + h.host + "\" has " +
                            std::to_string(h.slots.size()) + " slot(s)");
        h.slots.resize(size_t(*num_gpus));
      }
  }
  if (chosen.empty()) throw ConfigError("no host is left to run on after --include/--exclude");
  return chosen;
}

}  // namespace tessera
