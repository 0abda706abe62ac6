// Learning-rate schedules (optim/lr_schedule.h) against values worked out by hand from DeepSpeed's
// formulas (runtime/lr_schedules.py). Every expected number is a literal: lr_at(s) is DeepSpeed's
// get_lr() at last_batch_iteration i = s - 1, and s = 0 is the value its constructor writes.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "engine/config/config.h"
#include "optim/lr_schedule.h"

using namespace tessera;

namespace {

SchedulerConfig scheduler(const std::string& type) {
  SchedulerConfig c;
  c.type = type;
  c.params.kind = type;
  return c;
}

// The engine's call: the config's scheduler section, or none (a constant lr).
std::unique_ptr<LrSchedule> schedule_of(const std::optional<SchedulerConfig>& c, double base_lr) {
  return c ? make_lr_schedule(c->type, c->params, base_lr) : make_lr_schedule("", {}, base_lr);
}

std::vector<double> lrs(const LrSchedule& s, int64_t first, int64_t last) {
  std::vector<double> out;
  for (int64_t step = first; step <= last; ++step) out.push_back(s.lr_at(step));
  return out;
}

std::vector<double> moms(const LrSchedule& s, int64_t first, int64_t last) {
  std::vector<double> out;
  for (int64_t step = first; step <= last; ++step) out.push_back(s.momentum_at(step).value());
  return out;
}

// Tight enough that an off-by-one step or a wrong formula fails.
Approx near(double v) { return Approx(v).epsilon(1e-12).margin(1e-15); }
auto near(const std::vector<double>& v) {
  return Catch::Matchers::Approx(v).epsilon(1e-12).margin(1e-15);
}

}  // namespace


TEST_CASE("no scheduler gives the optimizer lr at every step") {
  auto s = schedule_of(std::nullopt, 3e-4);
  CHECK(s->name() == "constant");
  CHECK(s->lr_at(0) == 3e-4);
  CHECK(s->lr_at(1) == 3e-4);
  CHECK(s->lr_at(1000000) == 3e-4);
  CHECK_FALSE(s->momentum_at(5).has_value());
}

TEST_CASE("WarmupLR log warmup: ln(i+1)/ln(W) then held at warmup_max_lr") {
  auto c = scheduler("WarmupLR");
  c.params.warmup_min_lr = 0.001;
  c.params.warmup_max_lr = 0.011;
  c.params.warmup_num_steps = 10;
  c.params.warmup_type = "log";
  auto s = schedule_of(c, 123.0);  // base lr is ignored: WarmupLR sets absolute lrs
  CHECK(s->name() == "WarmupLR");
  CHECK(s->lr_at(0) == near(0.001));                // constructor: warmup_min_lr
  CHECK(s->lr_at(1) == near(0.001));                // i = 0: ln 1 = 0
  CHECK(s->lr_at(2) == near(0.0040102999566398));   // i = 1: 0.001 + 0.01 * log10(2)
  CHECK(s->lr_at(5) == near(0.0079897000433602));   // i = 4: 0.001 + 0.01 * log10(5)
  CHECK(s->lr_at(10) == near(0.011));               // i = 9 = W - 1: ln 10 / ln 10 = 1
  CHECK(s->lr_at(11) == near(0.011));               // i = W: held
  CHECK(s->lr_at(100000) == near(0.011));
  CHECK_FALSE(s->momentum_at(3).has_value());
}

TEST_CASE("WarmupLR linear warmup: i/W reaches warmup_max_lr one step after log") {
  auto c = scheduler("WarmupLR");
  c.params.warmup_min_lr = 0.0;
  c.params.warmup_max_lr = 0.01;
  c.params.warmup_num_steps = 10;
  c.params.warmup_type = "linear";
  auto s = schedule_of(c, 1.0);
  CHECK_THAT(lrs(*s, 0, 12), near(std::vector<double>{0.0, 0.0, 0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007,
                                                       0.008, 0.009, 0.01, 0.01}));
}

TEST_CASE("WarmupLR: warmup_num_steps 1 acts as 2 and 0 is rejected") {
  auto c = scheduler("WarmupLR");
  c.params.warmup_min_lr = 0.0;
  c.params.warmup_max_lr = 0.01;
  c.params.warmup_num_steps = 1;
  c.params.warmup_type = "linear";
  // W = max(2, 1) = 2: i = 1 gives 1/2 of the way.
  CHECK_THAT(lrs(*schedule_of(c, 1.0), 0, 3), near(std::vector<double>{0.0, 0.0, 0.005, 0.01}));
  c.params.warmup_type = "log";  // ln 2 / ln 2 = 1 at i = 1
  CHECK_THAT(lrs(*schedule_of(c, 1.0), 0, 3), near(std::vector<double>{0.0, 0.0, 0.01, 0.01}));
  c.params.warmup_num_steps = 0;
  CHECK_THROWS_AS(schedule_of(c, 1.0), std::invalid_argument);
}

TEST_CASE("WarmupDecayLR warms up then decays linearly to warmup_min_lr at total_num_steps") {
  auto c = scheduler("WarmupDecayLR");
  c.params.warmup_min_lr = 0.001;
  c.params.warmup_max_lr = 0.011;
  c.params.warmup_num_steps = 10;
  c.params.total_num_steps = 110;
  c.params.warmup_type = "linear";
  auto s = schedule_of(c, 1.0);
  CHECK(s->name() == "WarmupDecayLR");
  CHECK(s->lr_at(0) == near(0.001));
  CHECK(s->lr_at(2) == near(0.002));     // i = 1: 1/10
  CHECK(s->lr_at(10) == near(0.010));    // i = 9: 9/10
  CHECK(s->lr_at(11) == near(0.011));    // i = 10: (110 - 10) / 100 = 1
  CHECK(s->lr_at(12) == near(0.0109));   // i = 11: 0.99
  CHECK(s->lr_at(61) == near(0.006));    // i = 60: 0.5
  CHECK(s->lr_at(110) == near(0.0011));  // i = 109: 0.01
  CHECK(s->lr_at(111) == near(0.001));   // i = 110: 0, i.e. warmup_min_lr
  CHECK(s->lr_at(5000) == near(0.001));  // clamped at 0, not negative

  c.params.warmup_type = "log";
  auto l = schedule_of(c, 1.0);
  CHECK(l->lr_at(2) == near(0.0040102999566398));
  CHECK(l->lr_at(10) == near(0.011));  // log warmup tops out at i = 9 already
  CHECK(l->lr_at(61) == near(0.006));
}

TEST_CASE("WarmupCosineLR: ratios of the optimizer lr with linear warmup and cosine decay") {
  auto c = scheduler("WarmupCosineLR");
  c.params.total_num_steps = 110;
  c.params.warmup_num_steps = 10;
  c.params.warmup_min_ratio = 0.1;
  c.params.cos_min_ratio = 0.01;
  c.params.warmup_type = "linear";
  auto s = schedule_of(c, 0.1);
  CHECK(s->name() == "WarmupCosineLR");
  CHECK(s->lr_at(0) == near(0.0));     // constructor writes 0
  CHECK(s->lr_at(1) == near(0.01));    // i = 0: ratio 0.1
  CHECK(s->lr_at(6) == near(0.055));   // i = 5: 0.1 + 0.5 * 0.9
  CHECK(s->lr_at(10) == near(0.091));  // i = 9 (warmup end): 0.1 + 0.9 * 0.9
  // i = 10: first cosine step, progress 1/100: 0.1 * (0.01 + 0.99 * (1 + cos(0.01 pi)) / 2)
  CHECK(s->lr_at(11) == near(0.09997557473810371));
  // i = 34: progress 1/4: 0.1 * (0.01 + 0.99 * (1 + sqrt(2)/2) / 2)
  CHECK(s->lr_at(35) == near(0.0855017856687341));
  CHECK(s->lr_at(60) == near(0.0505));   // i = 59: progress 1/2: 0.1 * (0.01 + 0.99 / 2)
  CHECK(s->lr_at(110) == near(0.001));   // i = 109: progress 1: cos_min_ratio
  CHECK(s->lr_at(111) == near(0.001));   // clamped past the end
  CHECK(s->lr_at(10000) == near(0.001));
  CHECK_FALSE(s->momentum_at(50).has_value());
}

TEST_CASE("WarmupCosineLR log warmup with the default ratios") {
  auto c = scheduler("WarmupCosineLR");
  c.params.total_num_steps = 110;
  c.params.warmup_num_steps = 10;  // warmup_min_ratio 0, cos_min_ratio 1e-4, log
  auto s = schedule_of(c, 0.1);
  CHECK(s->lr_at(0) == near(0.0));
  CHECK(s->lr_at(1) == near(0.0));                 // i = 0: ln 1 = 0
  CHECK(s->lr_at(2) == near(0.030102999566398));   // i = 1: 0.1 * log10(2)
  CHECK(s->lr_at(10) == near(0.1));                // i = 9: 1
  CHECK(s->lr_at(110) == near(1e-5));              // 0.1 * 1e-4
}

TEST_CASE("OneCycle: a symmetric cycle up and down then flat at cycle_min_lr") {
  auto c = scheduler("OneCycle");
  c.params.cycle_min_lr = 0.001;
  c.params.cycle_max_lr = 0.011;
  c.params.cycle_first_step_size = 10;  // second half defaults to 10
  auto s = schedule_of(c, 1.0);
  CHECK(s->name() == "OneCycle");
  // step s (s <= 20): up 0.001 per step to the peak at s = 10, then down to cycle_min_lr at s = 20.
  CHECK_THAT(lrs(*s, 0, 22),
             near(std::vector<double>{0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009, 0.010, 0.011,
                                      0.010, 0.009, 0.008, 0.007, 0.006, 0.005, 0.004, 0.003, 0.002, 0.001, 0.001,
                                      0.001}));
  // beta1 moves against the lr; step 0 is DeepSpeed's constructor value, cycle_min_mom.
  CHECK_THAT(moms(*s, 0, 22),
             near(std::vector<double>{0.80, 0.89, 0.88, 0.87, 0.86, 0.85, 0.84, 0.83, 0.82, 0.81, 0.80, 0.81, 0.82,
                                      0.83, 0.84, 0.85, 0.86, 0.87, 0.88, 0.89, 0.90, 0.90, 0.90}));
  CHECK(s->lr_at(100000) == near(0.001));
  CHECK(kOneCycleBeta2 == 0.99);
}

TEST_CASE("OneCycle: an asymmetric cycle") {
  auto c = scheduler("OneCycle");
  c.params.cycle_min_lr = 0.001;
  c.params.cycle_max_lr = 0.011;
  c.params.cycle_first_step_size = 4;
  c.params.cycle_second_step_size = 12;
  auto s = schedule_of(c, 1.0);
  CHECK(s->lr_at(2) == near(0.006));    // x = 2/16, s = x / 0.25 = 0.5
  CHECK(s->lr_at(4) == near(0.011));    // peak
  CHECK(s->lr_at(10) == near(0.006));   // x = 10/16: (x - 1) / (0.25 - 1) = 0.5
  CHECK(s->lr_at(13) == near(0.0035));  // x = 13/16: 0.25
  CHECK(s->lr_at(16) == near(0.001));   // end of the cycle
  CHECK(s->lr_at(17) == near(0.001));   // no decay configured
}

TEST_CASE("OneCycle: stair counts hold the lr flat across each stair") {
  auto c = scheduler("OneCycle");
  c.params.cycle_min_lr = 0.001;
  c.params.cycle_max_lr = 0.011;
  c.params.cycle_first_step_size = 10;
  c.params.cycle_first_stair_count = 2;  // the second half defaults to 2 stairs as well
  auto s = schedule_of(c, 1.0);
  CHECK_THAT(lrs(*s, 0, 20),
             near(std::vector<double>{0.001, 0.001, 0.001, 0.001, 0.001, 0.006, 0.006, 0.006, 0.006, 0.006, 0.011,
                                      0.006, 0.006, 0.006, 0.006, 0.006, 0.001, 0.001, 0.001, 0.001, 0.001}));
  CHECK(*s->momentum_at(5) == near(0.85));
  CHECK(*s->momentum_at(10) == near(0.80));
  CHECK(*s->momentum_at(16) == near(0.90));

  c.params.cycle_second_stair_count = 5;  // falling half: floor((20 - b) * 5 / 10) / 5
  auto t = schedule_of(c, 1.0);
  CHECK(t->lr_at(9) == near(0.006));   // rising half still 2 stairs
  CHECK(t->lr_at(11) == near(0.009));  // floor(4.5) / 5 = 0.8
  CHECK(t->lr_at(13) == near(0.007));  // floor(3.5) / 5 = 0.6
  CHECK(t->lr_at(18) == near(0.003));  // floor(1.0) / 5 = 0.2
  CHECK(t->lr_at(19) == near(0.001));  // floor(0.5) = 0
}

TEST_CASE("OneCycle: decay after the cycle divides the lr and grows beta1") {
  auto c = scheduler("OneCycle");
  c.params.cycle_min_lr = 0.001;
  c.params.cycle_max_lr = 0.011;
  c.params.cycle_first_step_size = 10;
  c.params.decay_lr_rate = 0.5;
  c.params.decay_step_size = 2;
  c.params.decay_mom_rate = 0.05;
  auto s = schedule_of(c, 1.0);
  // d = step - 20, k = d / 2 (not floored): lr = 0.001 / (1 + 0.5 k), mom = 0.9 (1 + 0.05 k)
  CHECK_THAT(lrs(*s, 20, 24),
             near(std::vector<double>{0.001, 0.0008, 0.001 / 1.5, 0.001 / 1.75, 0.0005}));
  CHECK_THAT(moms(*s, 20, 24), near(std::vector<double>{0.9, 0.9225, 0.945, 0.9675, 0.99}));

  c.params.decay_step_size = 0;  // turns both decays off
  auto flat = schedule_of(c, 1.0);
  CHECK(flat->lr_at(30) == near(0.001));
  CHECK(*flat->momentum_at(30) == near(0.9));

  c.params.decay_step_size = 2;
  c.params.decay_mom_rate = 0.0;  // only the lr decays
  auto lr_only = schedule_of(c, 1.0);
  CHECK(lr_only->lr_at(24) == near(0.0005));
  CHECK(*lr_only->momentum_at(24) == near(0.9));
}

TEST_CASE("OneCycle without cycle_momentum reports no momentum") {
  auto c = scheduler("OneCycle");
  c.params.cycle_min_lr = 0.001;
  c.params.cycle_max_lr = 0.011;
  c.params.cycle_momentum = false;
  auto s = schedule_of(c, 1.0);
  CHECK_FALSE(s->momentum_at(0).has_value());
  CHECK_FALSE(s->momentum_at(100).has_value());
}

TEST_CASE("make_lr_schedule rejects configs that skipped validation") {
  auto decay = scheduler("WarmupDecayLR");  // total_num_steps missing
  CHECK_THROWS_AS(schedule_of(decay, 1.0), std::invalid_argument);
  auto cosine = scheduler("WarmupCosineLR");
  CHECK_THROWS_AS(schedule_of(cosine, 1.0), std::invalid_argument);
  auto cycle = scheduler("OneCycle");  // cycle_min_lr / cycle_max_lr missing
  CHECK_THROWS_AS(schedule_of(cycle, 1.0), std::invalid_argument);
  CHECK_THROWS_AS(schedule_of(scheduler("StepLR"), 1.0), std::invalid_argument);
  CHECK_THROWS_AS(schedule_of(std::nullopt, 1.0)->lr_at(-1), std::invalid_argument);
}
