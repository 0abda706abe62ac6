// Rendezvous: who am I, how many are we, and where do we meet.
//
// Reads the environment users already launch with — torchrun's (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), SLURM's, Open MPI's — or runs as a single process
// when none is set. Then every rank checks in at a c10d TCPStore hosted by rank 0; a rank that
// never arrives makes every other rank fail within the timeout with a message naming it.
#pragma once

#include <chrono>
#include <map>
#include <stdexcept>
#include <string>

#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Store;
}

namespace tessera {

struct RendezvousInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single process";  // "torchrun", "slurm", "openmpi"
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // TESSERA_TIMEOUT_S
  // Rank 0 joins a store someone else hosts on the port when it cannot host one there itself:
  // set when torch.distributed's default group was made first (env:// hosts its store there).
  bool store_may_exist = false;
  // The address rank 0's store listens on (TESSERA_STORE_BIND): empty, the default, binds it to
  // master_addr only, so the store is reachable where the job said it is and nowhere else; "*"
  // listens on every interface (LibTorch's own default).
  std::string store_bind;
  // torchrun's agent hosts the store on MASTER_PORT itself (TORCHELASTIC_USE_AGENT_STORE=True):
  // rank 0 joins it like every other rank.
  bool agent_hosts_store = false;
};

class RendezvousError : public std::runtime_error {
 public:
  explicit RendezvousError(const std::string& what) : std::runtime_error(what) {}
};

// Reads the variables of `env` (the process environment when empty). Throws RendezvousError when
// they are incomplete or inconsistent.
RendezvousInfo rendezvous_info_from_environment(const std::map<std::string, std::string>& env = {});

// The first host of a SLURM node list: "node[03-05,09],gpu7" -> "node03".
std::string first_slurm_host(const std::string& nodelist);

// Connects to (rank 0: hosts) the store and waits until every rank has checked in.
c10::intrusive_ptr<c10d::Store> rendezvous(const RendezvousInfo& info);

}  // namespace tessera
