// Rendezvous from each launcher's environment, and a rank that never arrives.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "parallel/parallel_context.h"
#include "parallel/rendezvous.h"
#include "tests/subprocess.h"

using namespace tessera;
using tessera::testing::contains;

TEST_CASE("torchrun's variables") {
  auto info = rendezvous_info_from_environment({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"},
                                                {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.1.2.3"},
                                                {"MASTER_PORT", "1234"}, {"TESSERA_TIMEOUT_S", "2.5"}});
  CHECK(info.source == "torchrun");
  CHECK(info.rank == 3);
  CHECK(info.world_size == 4);
  CHECK(info.local_rank == 1);
  CHECK(info.local_world_size == 2);
  CHECK(info.master_addr == "10.1.2.3");
  CHECK(info.master_port == 1234);
  CHECK(info.timeout.count() == 2500);
  CHECK(info.store_bind.empty());  // rank 0's store listens on MASTER_ADDR only
  CHECK_FALSE(info.agent_hosts_store);
  auto agent = rendezvous_info_from_environment({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                                 {"TESSERA_STORE_BIND", "*"}});
  CHECK(agent.agent_hosts_store);  // torchrun's agent hosts it: rank 0 joins
  CHECK(agent.store_bind == "*");
}

TEST_CASE("rank 0 refuses a master address that is not its host's and says how to listen elsewhere") {
  auto result = tessera::testing::run({TESSERA_WORKER_PATH, "context"},
                                      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "192.0.2.1"},
                                       {"MASTER_PORT", "29731"}, {"TESSERA_TIMEOUT_S", "5"}},
                                      60);
  INFO(result.output);
  CHECK(result.status != 0);
  CHECK(contains(result.output, "192.0.2.1 is not an address of this host"));
  CHECK(contains(result.output, "TESSERA_STORE_BIND=*"));
}

TEST_CASE("SLURM's variables with the master taken from the node list") {
  auto info = rendezvous_info_from_environment({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                                                {"SLURM_NTASKS_PER_NODE", "4(x2)"},
                                                {"SLURM_JOB_NODELIST", "gpu[07-08]"}});
  CHECK(info.source == "slurm");
  CHECK(info.rank == 5);
  CHECK(info.world_size == 8);
  CHECK(info.local_world_size == 4);
  CHECK(info.master_addr == "gpu07");
  CHECK(first_slurm_host("node[03-05,09],gpu7") == "node03");
  CHECK(first_slurm_host("a1,b2") == "a1");
}

TEST_CASE("Open MPI's variables") {
  auto info = rendezvous_info_from_environment({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  CHECK(info.source == "openmpi");
  CHECK(info.rank == 1);
  CHECK(info.master_addr == "127.0.0.1");
  CHECK_THROWS_WITH(rendezvous_info_from_environment({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
                    Catch::Contains("MASTER_ADDR"));
}

TEST_CASE("no launcher variables means one process") {
  auto info = rendezvous_info_from_environment({{"HOME", "/root"}});
  CHECK(info.source == "single process");
  CHECK(info.world_size == 1);
  CHECK(info.rank == 0);
}

TEST_CASE("inconsistent variables are clear errors") {
  CHECK_THROWS_WITH(rendezvous_info_from_environment({{"RANK", "4"}, {"WORLD_SIZE", "4"}}),
                    Catch::Contains("rank 4 is outside [0, 4)"));
  CHECK_THROWS_WITH(rendezvous_info_from_environment({{"RANK", "x"}, {"WORLD_SIZE", "4"}}),
                    Catch::Contains("RANK=\"x\" is not an integer"));
  CHECK_THROWS_WITH(rendezvous_info_from_environment({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}),
                    Catch::Contains("MASTER_PORT 70000"));
}

TEST_CASE("a rank that never arrives makes the others fail within the timeout naming it") {
  // Rank 0 of 3 alone (ranks 1 and 2 are never started).
  auto r = tessera::testing::run({TESSERA_WORKER_PATH, "context"},
                                 {{"RANK", "0"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "127.0.0.1"},
                                  {"MASTER_PORT", std::to_string(tessera::testing::free_port())}, {"TESSERA_TIMEOUT_S", "2"}},
                                 30);
  CHECK(r.status == 1);
  CHECK(r.seconds < 10);
  CHECK(contains(r.output, "timed out after 2 s"));
  CHECK(contains(r.output, "2 of 3 ranks never arrived (missing ranks 1, 2)"));
}

TEST_CASE("a rank whose master never arrives fails within the timeout naming rank 0") {
  auto r = tessera::testing::run({TESSERA_WORKER_PATH, "context"},
                                 {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                                  {"MASTER_PORT", std::to_string(tessera::testing::free_port())}, {"TESSERA_TIMEOUT_S", "2"}},
                                 30);
  CHECK(r.status == 1);
  CHECK(r.seconds < 15);
  CHECK(contains(r.output, "rank 0 never arrived"));
}

TEST_CASE("a port in use is reported with the way to change it and no C++ backtrace") {
  // A listening socket holds the port, so rank 0 cannot host the store there.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t length = sizeof(addr);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(fd, 1) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));

  // Under tessera launch only --master-port changes the port (before: "set MASTER_PORT").
  auto launched = tessera::testing::run({TESSERA_CLI_PATH, "launch", "--nproc-per-node", "2", "--master-port", port,
                                         "--timeout", "5", "--", TESSERA_WORKER_PATH, "context"},
                                        {}, 60);
  // Started by hand (or another launcher), the variable is the way.
  auto by_hand = tessera::testing::run({TESSERA_WORKER_PATH, "context"},
                                       {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                                        {"MASTER_PORT", port}, {"TESSERA_TIMEOUT_S", "5"}},
                                       60);
  ::close(fd);
  INFO(launched.output << "\n----\n" << by_hand.output);
  CHECK(launched.status != 0);
  CHECK(contains(launched.output, "could not host the rendezvous store"));
  CHECK(contains(launched.output, "--master-port"));
  CHECK_FALSE(contains(launched.output, "set MASTER_PORT"));
  CHECK_FALSE(contains(launched.output, "frame #"));  // torch's backtrace stays out of the message
  CHECK(by_hand.status != 0);
  CHECK(contains(by_hand.output, "set MASTER_PORT to a free port"));
}

TEST_CASE("a context made with the world group only makes its axis groups once, when asked") {
  tessera::ParallelOptions options;
  options.backend = "gloo";
  options.defer_axis_groups = true;
  tessera::ParallelContext context(tessera::rendezvous_info_from_environment({{"NOTHING", "1"}}), options);
  CHECK_FALSE(context.axis_groups_made());
  CHECK(context.world().size() == 1);
  CHECK_THROWS_WITH(context.data(), Catch::Contains("only the world group exists"));
  CHECK(context.describe().find("world group only") != std::string::npos);
  CHECK_THROWS_WITH(context.make_axis_groups(2, 1), Catch::Contains("tensor_parallel.tp_size"));
  CHECK_FALSE(context.axis_groups_made());  // a refused grid leaves nothing half made
  context.make_axis_groups(1, 1);
  CHECK(context.axis_groups_made());
  CHECK(context.data().size() == 1);
  CHECK_THROWS_WITH(context.make_axis_groups(1, 1), Catch::Contains("made once"));
}
