// Cutting a model given as an ordered list of layers into pipeline stages, as DeepSpeed's
// PipelineModule does with `partition_method`:
//   "uniform"      the same number of layers on every stage (the first n mod p stages one more);
//   "parameters"   contiguous stages whose largest parameter count is as small as it can be;
//   "type:REGEX"   the same, counting only the layers whose type matches REGEX (case-insensitive),
//                  e.g. "type:block" balances the transformer blocks whatever the embeddings weigh.
// Every stage gets at least one layer.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "parallel/pipeline/schedule.h"

namespace tessera::pipeline {

struct LayerInfo {
  std::string type;        // the layer's class name ("Embedding", "Block", "LayerNorm", ...)
  int64_t parameters = 0;
};

// The first layer of each stage, then the number of layers: stage s owns layers
// [bounds[s], bounds[s + 1]). Errors name pipeline.stages / pipeline.partition_method.
std::vector<int> partition_layers(const std::vector<LayerInfo>& layers, int stages, const std::string& method);

// Interleaved schedules: the layers cut into stages·chunks model chunks by `method` (chunks 1:
// partition_layers). With "uniform" or "type:REGEX" the layers counted must divide evenly into the
// chunks (the schedule assumes chunks of equal cost); errors name pipeline.virtual_stages.
std::vector<int> partition_chunks(const std::vector<LayerInfo>& layers, int stages, int chunks, const std::string& method);

// Stage `stage`'s layer ranges [begin, end) under `bounds` of stages·v chunks, in its local chunk
// order: with the loop placement chunks stage, stage + stages, ... (rank r holds the non-adjacent
// chunks r, r + p, ...); with the V placement (zb_v, two chunks) stage and 2·stages − 1 − stage.
std::vector<std::pair<int, int>> stage_layer_ranges(const std::vector<int>& bounds, int stage, int stages,
                                                    Placement placement = Placement::Loop);

// Contiguous parts of `weights` (as many as `parts`, none empty) whose largest sum is the
// smallest possible; the bounds as above.
std::vector<int> partition_balanced(const std::vector<int64_t>& weights, int parts);

// The partition as printed once at start: one line per stage with its layers and parameters (with
// more bounds than `stages`, one per model chunk, naming the stage that holds it).
std::string describe_partition(const std::vector<LayerInfo>& layers, const std::vector<int>& bounds, int stages = 0,
                               Placement placement = Placement::Loop);

}  // namespace tessera::pipeline
