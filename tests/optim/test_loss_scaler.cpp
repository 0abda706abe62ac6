// Loss scalers (optim/loss_scaler.h) against sequences worked out by hand from DeepSpeed's
// runtime/fp16/loss_scaler.py: dynamic scaling with its window and hysteresis, static scales, and
// the unit scale of fp32 and bf16.
#include <catch2/catch.hpp>

#include <vector>

#include "engine/config/config.h"
#include "optim/loss_scaler.h"

using namespace tessera;

namespace {

// The scale after each update, and whether each step was skipped.
struct Run {
  std::vector<double> scales;
  std::vector<bool> skipped;
};
Run run(LossScaler& scaler, const std::vector<bool>& overflows) {
  Run r;
  for (bool overflow : overflows) {
    const double before = scaler.scale();
    UpdateResult u = scaler.update(overflow);
    REQUIRE(u.old_scale == before);
    REQUIRE(u.new_scale == scaler.scale());
    r.scales.push_back(u.new_scale);
    r.skipped.push_back(u.skip_step);
  }
  return r;
}

constexpr bool O = true;   // overflow
constexpr bool C = false;  // clean step

Fp16Config fp16_dynamic(int initial_scale_power, int64_t window, int hysteresis, bool consecutive = false,
                        double min_loss_scale = 1.0) {
  Fp16Config f;
  f.enabled = true;
  f.initial_scale_power = initial_scale_power;
  f.loss_scale_window = window;
  f.hysteresis = hysteresis;
  f.consecutive_hysteresis = consecutive;
  f.min_loss_scale = min_loss_scale;
  return f;
}

}  // namespace


TEST_CASE("dynamic loss scale doubles on the clean step after scale_window clean steps") {
  auto window2 = make_loss_scaler(fp16_dynamic(3, 2, 2), false);
  CHECK(window2->dynamic());
  CHECK(window2->scale() == 8.0);
  Run r = run(*window2, {C, C, C, C, C});
  CHECK(r.scales == std::vector<double>{8, 8, 16, 16, 32});
  CHECK(r.skipped == std::vector<bool>{false, false, false, false, false});

  auto window1 = make_loss_scaler(fp16_dynamic(3, 1, 2), false);  // the very first step never doubles
  CHECK(run(*window1, {C, C, C}).scales == std::vector<double>{8, 16, 32});
}

TEST_CASE("hysteresis 2: the first overflow is absorbed and the next halves the scale") {
  auto s = make_loss_scaler(fp16_dynamic(3, 1000, 2), false);
  Run r = run(*s, {O, O, O});
  CHECK(r.scales == std::vector<double>{8, 4, 2});
  CHECK(r.skipped == std::vector<bool>{true, true, true});  // the absorbed overflow is skipped too

  auto no_hysteresis = make_loss_scaler(fp16_dynamic(3, 1000, 1), false);
  CHECK(run(*no_hysteresis, {O, O}).scales == std::vector<double>{4, 2});
}

TEST_CASE("consecutive_hysteresis refills hysteresis on every clean step") {
  const std::vector<bool> pattern = {O, C, O, C, O};
  auto plain = make_loss_scaler(fp16_dynamic(10, 1000, 2, false), false);
  Run a = run(*plain, pattern);
  CHECK(a.scales == std::vector<double>{1024, 1024, 512, 512, 256});  // refilled only by a doubling
  CHECK(a.skipped == std::vector<bool>{true, false, true, false, true});

  auto consecutive = make_loss_scaler(fp16_dynamic(10, 1000, 2, true), false);
  Run b = run(*consecutive, pattern);
  CHECK(b.scales == std::vector<double>{1024, 1024, 1024, 1024, 1024});
  CHECK(b.skipped == std::vector<bool>{true, false, true, false, true});
}

TEST_CASE("the worked loss-scale sequence of the docs") {
  // init 8, window 2, hysteresis 2: a doubling refills the hysteresis.
  auto s = make_loss_scaler(fp16_dynamic(3, 2, 2), false);
  Run r = run(*s, {C, C, C, O, O, O, C, C, C, O, O});
  CHECK(r.scales == std::vector<double>{8, 8, 16, 16, 8, 4, 4, 4, 8, 8, 4});
  CHECK(r.skipped == std::vector<bool>{false, false, false, true, true, true, false, false, false, true, true});
}

TEST_CASE("an overflow at min_loss_scale that needs a lower scale raises LossScaleError") {
  auto s = make_loss_scaler(fp16_dynamic(2, 1000, 1), false);  // 4, min 1
  CHECK(run(*s, {O, O}).scales == std::vector<double>{2, 1});
  try {
    s->update(true);
    FAIL("expected LossScaleError");
  } catch (const LossScaleError& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("min_loss_scale = 1"));
    CHECK_THAT(what, Catch::Contains("step 2"));
    CHECK_THAT(what, Catch::Contains("bf16"));
  }
  CHECK(s->scale() == 1.0);
  CHECK(s->update(false).new_scale == 1.0);  // the scaler is still usable

  // With hysteresis left, an overflow at the minimum is absorbed first.
  auto h = make_loss_scaler(fp16_dynamic(0, 1000, 2), false);  // 1, min 1
  CHECK(h->update(true).new_scale == 1.0);
  CHECK_THROWS_AS(h->update(true), LossScaleError);

  // The halving is clamped at min_loss_scale, which then counts as the minimum.
  auto m = make_loss_scaler(fp16_dynamic(4, 1000, 1, false, 3.0), false);  // 16, min 3
  CHECK(run(*m, {O, O, O}).scales == std::vector<double>{8, 4, 3});
  CHECK_THROWS_WITH(m->update(true), Catch::Contains("min_loss_scale = 3") && Catch::Contains("step 3"));
}

TEST_CASE("a saved dynamic scaler state resumes the same sequence") {
  DynamicLossScaler a(8, 2, 1, 2, false);
  run(a, {C, C, O});
  DynamicLossScaler b(65536, 2, 1, 2, false);
  b.load_state(a.state());
  const std::vector<bool> rest = {O, C, C, C, O};
  CHECK(run(a, rest).scales == run(b, rest).scales);
}

TEST_CASE("a static loss scale never changes but overflowing steps are skipped") {
  Fp16Config f;
  f.enabled = true;
  f.loss_scale = 128;
  auto s = make_loss_scaler(f, false);
  CHECK_FALSE(s->dynamic());
  Run r = run(*s, {C, O, O, O, C});
  CHECK(r.scales == std::vector<double>{128, 128, 128, 128, 128});
  CHECK(r.skipped == std::vector<bool>{false, true, true, true, false});
}

TEST_CASE("fp32 and bf16 use a unit scale and skip exactly the non-finite steps") {
  // One rule for every precision: the scaler's skip_step is what the engine does. Before, the unit
  // scaler said "never skips" while the engine skipped non-finite steps on its own.
  Fp16Config off;  // fp16 disabled
  for (bool bf16 : {false, true}) {
    auto s = make_loss_scaler(off, bf16);
    CHECK_FALSE(s->dynamic());
    CHECK(s->scale() == 1.0);
    Run r = run(*s, {O, C, O});
    CHECK(r.scales == std::vector<double>{1, 1, 1});
    CHECK(r.skipped == std::vector<bool>{true, false, true});
  }
}

TEST_CASE("make_loss_scaler: DeepSpeed's defaults and the fp16 with bf16 contradiction") {
  Fp16Config f;
  f.enabled = true;  // initial_scale_power 16, window 1000, hysteresis 2, min 1
  auto s = make_loss_scaler(f, false);
  CHECK(s->dynamic());
  CHECK(s->scale() == 65536.0);
  CHECK_THROWS_AS(make_loss_scaler(f, true), std::invalid_argument);
}
