#include "parallel/rendezvous.h"

#include "parallel/c10d_compat.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

extern char** environ;

namespace tessera {

namespace {

std::map<std::string, std::string> process_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string entry(*e);
    size_t eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return env;
}

class Env {
 public:
  explicit Env(const std::map<std::string, std::string>& vars) : vars_(vars) {}
  bool has(const std::string& name) const { return vars_.count(name) > 0; }
  std::string text(const std::string& name, const std::string& fallback) const {
    auto it = vars_.find(name);
    return it == vars_.end() || it->second.empty() ? fallback : it->second;
  }
  int integer(const std::string& name, int fallback) const {
    auto it = vars_.find(name);
    if (it == vars_.end() || it->second.empty()) return fallback;
    // SLURM writes per-node counts like "2(x3)": the leading number is the one we want.
    char* end = nullptr;
    long value = std::strtol(it->second.c_str(), &end, 10);
    if (end == it->second.c_str())
      throw RendezvousError("environment variable " + name + "=\"" + it->second + "\" is not an integer");
    return static_cast<int>(value);
  }

 private:
  const std::map<std::string, std::string>& vars_;
};

std::string hostname() {
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// A listening socket on `address`:`port` for rank 0's store (LibTorch's TCPStore would listen on
// every interface; handed this socket, it serves on it alone). errno-style failures come back as
// a message; EADDRINUSE is told apart, for the caller that may join a store already there.
struct BoundSocket {
  int fd = -1;
  bool in_use = false;
  std::string error;
};

BoundSocket listen_on(const std::string& address, int port) {
  BoundSocket out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(address.c_str(), service.c_str(), &hints, &found)) {
    out.error = "cannot resolve " + address + ": " + gai_strerror(rc);
    return out;
  }
  int failure = 0;
  for (addrinfo* a = found; a && out.fd < 0; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 4096) == 0) {
      out.fd = fd;
      break;
    }
    failure = errno;
    out.in_use = out.in_use || failure == EADDRINUSE;
    out.error = std::strerror(failure);
    close(fd);
  }
  freeaddrinfo(found);
  if (out.fd < 0 && failure == EADDRNOTAVAIL)
    out.error += " (" + address + " is not an address of this host, where rank 0 runs: set MASTER_ADDR to one "
                 "of its addresses, or TESSERA_STORE_BIND=* to listen on every interface)";
  return out;
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  std::string first = nodelist.substr(0, nodelist.find(','));
  size_t open = nodelist.find('[');
  if (open == std::string::npos || open > first.size()) return first;
  // "node[03-05,09]": the prefix plus the first number of the range list, zero padding kept.
  size_t stop = nodelist.find_first_of("-,]", open + 1);
  return nodelist.substr(0, open) + nodelist.substr(open + 1, stop - open - 1);
}

RendezvousInfo rendezvous_info_from_environment(const std::map<std::string, std::string>& vars) {
  std::map<std::string, std::string> own;
  if (vars.empty()) own = process_environment();
  Env env(vars.empty() ? own : vars);
  RendezvousInfo info;
  if (env.has("RANK") && env.has("WORLD_SIZE")) {
    info.source = "torchrun";
    info.rank = env.integer("RANK", 0);
    info.world_size = env.integer("WORLD_SIZE", 1);
    info.local_rank = env.integer("LOCAL_RANK", 0);
    info.local_world_size = env.integer("LOCAL_WORLD_SIZE", info.world_size);
  } else if (env.has("SLURM_PROCID") && env.has("SLURM_NTASKS")) {
    info.source = "slurm";
    info.rank = env.integer("SLURM_PROCID", 0);
    info.world_size = env.integer("SLURM_NTASKS", 1);
    info.local_rank = env.integer("SLURM_LOCALID", 0);
    info.local_world_size = env.integer("SLURM_NTASKS_PER_NODE", env.integer("SLURM_TASKS_PER_NODE", 1));
    if (!env.has("MASTER_ADDR") && env.has("SLURM_JOB_NODELIST"))
      info.master_addr = first_slurm_host(env.text("SLURM_JOB_NODELIST", ""));
  } else if (env.has("OMPI_COMM_WORLD_RANK") && env.has("OMPI_COMM_WORLD_SIZE")) {
    info.source = "openmpi";
    info.rank = env.integer("OMPI_COMM_WORLD_RANK", 0);
    info.world_size = env.integer("OMPI_COMM_WORLD_SIZE", 1);
    info.local_rank = env.integer("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    info.local_world_size = env.integer("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
    if (!env.has("MASTER_ADDR") && info.local_world_size != info.world_size)
      throw RendezvousError("Open MPI launch across nodes: set MASTER_ADDR to rank 0's host (mpirun -x MASTER_ADDR=...)");
  }
  info.master_addr = env.text("MASTER_ADDR", info.master_addr);
  info.master_port = env.integer("MASTER_PORT", info.master_port);
  info.store_bind = env.text("TESSERA_STORE_BIND", "");
  info.agent_hosts_store = env.text("TORCHELASTIC_USE_AGENT_STORE", "") == "True";
  double timeout_s = std::atof(env.text("TESSERA_TIMEOUT_S", "300").c_str());
  if (timeout_s <= 0) throw RendezvousError("TESSERA_TIMEOUT_S must be a positive number of seconds");
  info.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));

  const std::string from = " (from " + info.source + "'s environment)";
  if (info.world_size < 1) throw RendezvousError("world size " + std::to_string(info.world_size) + " < 1" + from);
  if (info.rank < 0 || info.rank >= info.world_size)
    throw RendezvousError("rank " + std::to_string(info.rank) + " is outside [0, " +
                          std::to_string(info.world_size) + ")" + from);
  if (info.local_rank < 0 || info.local_rank >= std::max(info.local_world_size, 1))
    throw RendezvousError("local rank " + std::to_string(info.local_rank) + " is outside [0, " +
                          std::to_string(info.local_world_size) + ")" + from);
  if (info.master_port < 1 || info.master_port > 65535)
    throw RendezvousError("MASTER_PORT " + std::to_string(info.master_port) + " is not a TCP port");
  return info;
}

c10::intrusive_ptr<c10d::Store> rendezvous(const RendezvousInfo& info) {
  if (info.world_size == 1) return c10::make_intrusive<c10d::HashStore>();
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + info.timeout;
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%g", info.timeout.count() / 1000.0);
  const std::string where = info.master_addr + ":" + std::to_string(info.master_port);

  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(info.master_port);
  options.isServer = info.rank == 0 && !info.agent_hosts_store;
  options.numWorkers = std::nullopt;  // tessera does its own check-in below, to name who is missing
  options.waitWorkers = false;
  options.timeout = info.timeout;
  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    if (options.isServer && info.store_bind != "*") {
      // The store listens where the job said it is (or TESSERA_STORE_BIND), not on every interface.
      const std::string address = info.store_bind.empty() ? info.master_addr : info.store_bind;
      BoundSocket bound = listen_on(address, info.master_port);
      if (bound.fd >= 0) {
        options.masterListenFd = bound.fd;  // the store owns it from here
      } else if (bound.in_use && info.store_may_exist) {
        options.isServer = false;  // the port is taken by the store torch.distributed hosts: join it
      } else {
        throw std::runtime_error("cannot listen on " + address + ":" + std::to_string(info.master_port) + ": " +
                                 bound.error);
      }
    }
    try {
      store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, options);
    } catch (const std::exception&) {
      if (!options.isServer || !info.store_may_exist || options.masterListenFd) throw;
      options.isServer = false;  // the port is taken by the store torch.distributed hosts: join it
      store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, options);
    }
  } catch (const std::exception& e) {
    // Under `tessera launch` the launcher sets MASTER_PORT itself: only its flag changes the port.
    const char* launched = std::getenv("TESSERA_LAUNCHED");
    const std::string how = launched && std::string(launched) == "1"
                                ? "pass another port to tessera launch with --master-port"
                                : "set MASTER_PORT to a free port";
    if (info.rank == 0)
      throw RendezvousError("rank 0 could not host the rendezvous store on " + where + " (is the port in use? " +
                            how + "): " + message_of(e));
    throw RendezvousError("rank " + std::to_string(info.rank) + " could not reach the rendezvous store at " + where +
                          " hosted by rank 0 within " + std::string(seconds) + " s: rank 0 never arrived. (" +
                          message_of(e) + ")");
  }

  // Each rank leaves its name and bumps a counter; only on timeout are the names read, to say who
  // is missing (polling one counter scales to thousands of ranks).
  const std::string prefix = "tessera/rendezvous/";
  std::string me = hostname() + " pid " + std::to_string(getpid());
  store->set(prefix + std::to_string(info.rank), std::vector<uint8_t>(me.begin(), me.end()));
  store->add(prefix + "arrived", 1);
  while (store->add(prefix + "arrived", 0) < info.world_size) {
    if (Clock::now() >= deadline) {
      std::vector<int> missing;
      for (int r = 0; r < info.world_size; ++r)
        if (!store->check({prefix + std::to_string(r)})) missing.push_back(r);
      std::string names;
      for (size_t i = 0; i < missing.size() && i < 16; ++i) names += (i ? ", " : "") + std::to_string(missing[i]);
      if (missing.size() > 16) names += ", ...";
      throw RendezvousError("rendezvous at " + where + " timed out after " + seconds + " s: " +
                            std::to_string(missing.size()) + " of " + std::to_string(info.world_size) +
                            " ranks never arrived (missing rank" + (missing.size() > 1 ? "s " : " ") + names +
                            "); this is rank " + std::to_string(info.rank) + " on " + hostname());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return store;
}

}  // namespace tessera
