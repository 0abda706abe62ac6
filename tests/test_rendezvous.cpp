// Rendezvous from each launcher's environment, and a rank that never arrives.
#include <catch2/catch.hpp>

#include "parallel/rendezvous.h"
#include "subprocess.h"

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
                                  {"MASTER_PORT", "29731"}, {"TESSERA_TIMEOUT_S", "2"}},
                                 30);
  CHECK(r.status == 1);
  CHECK(r.seconds < 10);
  CHECK(contains(r.output, "timed out after 2 s"));
  CHECK(contains(r.output, "2 of 3 ranks never arrived (missing ranks 1, 2)"));
}

TEST_CASE("a rank whose master never arrives fails within the timeout naming rank 0") {
  auto r = tessera::testing::run({TESSERA_WORKER_PATH, "context"},
                                 {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                                  {"MASTER_PORT", "29732"}, {"TESSERA_TIMEOUT_S", "2"}},
                                 30);
  CHECK(r.status == 1);
  CHECK(r.seconds < 15);
  CHECK(contains(r.output, "rank 0 never arrived"));
}
