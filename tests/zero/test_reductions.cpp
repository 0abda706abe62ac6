// The reductions of one backward in flight and their staging buffers (zero/reductions.h), without
// a communicator (an empty CommHandle completes at once): finishes in launch order, at most two in
// flight; a group's pool lends two buffers, zeroed, and a third request first finishes the oldest
// reduction (which may hand one back) or, with nothing in flight, allocates; free_staging hands
// every pooled buffer back; the most staging held at once is reported.
#include <catch2/catch.hpp>

#include <ATen/ops/full.h>

#include <vector>

#include "zero/reductions.h"

using namespace tessera;

TEST_CASE("reductions: finished in launch order - make_room keeps at most two in flight") {
  Reductions r(c10::Device(c10::kCPU));
  std::vector<int> finished;
  for (int i = 0; i < 3; ++i) {
    r.make_room();
    r.push(CommHandle(), [&finished, i] { finished.push_back(i); });
  }
  CHECK(finished == std::vector<int>{0});  // the third launch waited for the first
  r.wait_all();
  CHECK(finished == std::vector<int>{0, 1, 2});
  CHECK(r.empty());
}

TEST_CASE("reductions: a pool lends two zeroed buffers - a third request finishes the oldest reduction first") {
  Reductions r(c10::Device(c10::kCPU));
  r.set_staging_pools({100, 40});
  at::Tensor a = r.acquire_staging(0, 80);
  a.fill_(3.0f);
  at::Tensor b = r.acquire_staging(0, 100);
  CHECK(a.numel() == 80);
  CHECK(r.staging_bytes() == 2 * 100 * 4);
  // a's reduction is in flight and hands a back when it finishes.
  r.push(CommHandle(), [&r, a] { r.release_staging(0, a); });
  at::Tensor c = r.acquire_staging(0, 50);
  CHECK(r.empty());                       // the reduction was finished to free a buffer
  CHECK(c.data_ptr() == a.data_ptr());    // and its buffer reused
  CHECK(c.numel() == 50);
  CHECK(c.abs().sum().item<float>() == 0.0f);  // zeroed
  CHECK(r.staging_bytes() == 2 * 100 * 4);
  // Nothing in flight and both lent: a third buffer, counted in the peak.
  at::Tensor d = r.acquire_staging(0, 10);
  CHECK(r.staging_bytes() == 3 * 100 * 4);
  // Another group's pool has its own buffers, of its largest bucket.
  at::Tensor e = r.acquire_staging(1, 40);
  CHECK(r.staging_bytes() == 3 * 100 * 4 + 40 * 4);
  for (const at::Tensor& t : {b, c, d}) r.release_staging(0, t);
  r.release_staging(1, e);
  r.free_staging();  // all back to the allocator; the next backward allocates again
  at::Tensor again = r.acquire_staging(0, 100);
  CHECK(again.numel() == 100);
  CHECK(r.staging_bytes() == 3 * 100 * 4 + 40 * 4);  // the peak stays
}
