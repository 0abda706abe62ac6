// What the engine acts on: the config keys that parse and validate but that the engine does not
// implement yet.
//
// A valid config is not necessarily one the engine can run. One table (engine/config/config_support.cpp)
// lists every JSON path the engine does not act on yet, with a severity:
//   Error    ignoring the key would change the result (ZeRO stage 3, offload, tensor or pipeline
//            parallelism, an optimizer the engine cannot build): the engine refuses the config;
//   Warning  the key is not read, but the training is the same without it (a tuning knob, a
//            logger, checkpoint options).
// A key whose value is DeepSpeed's default (or one of the values the engine does act on) changes
// nothing and is silent; any other value is named as "not implemented yet". `tessera config check`
// prints these with the config's own errors, and the engine checks them at start. The issue that
// implements a key removes its row from the table.
#pragma once

#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/config/config_io.h"

namespace tessera {

// One row of the table.
struct UnimplementedKey {
  // JSON path. Ending in "*", a pattern: "activation_checkpointing.*" is every key under that
  // section (nested sections included), "zero_optimization.stage3_*" every key of the section
  // starting with "stage3_"; keys with a row of their own are left to that row.
  const char* path;
  ConfigIssue::Severity severity;
  // JSON text: the values the engine acts on ("[0, 1, 2]"), or "" when only the default is.
  const char* acted_on;
  const char* note;  // what the engine does instead, or what is missing
  // Error rows that report this key with them: when one of them fires (or the config already has
  // an error there), this key is named in that error's message rather than on its own.
  const char* covered_by[2];
};

// Every row, in the order the issues are reported.
const std::vector<UnimplementedKey>& unimplemented_keys();

// The keys of `config` the engine does not act on yet, each "<path>: not implemented yet: ..."
// with the severity of its row; plus an error at "optimizer" when the config has no optimizer
// section (the engine builds the optimizer from it). Works on a parsed config, resolved or not.
// The engine throws when any of these is an error and prints the warnings.
std::vector<ConfigIssue> engine_support_issues(const Config& config);

// The same, added to `report` after the config's own errors: a key whose path (or an enclosing
// section) already has an error in `report` is not reported again.
void add_engine_support_issues(const Config& config, ConfigReport& report);

}  // namespace tessera
