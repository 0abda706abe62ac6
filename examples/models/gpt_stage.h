// The example GPT (gpt.h) as one pipeline stage: its layer ranges [begin, end) of the layer list
// (embedding, blocks, head), one per model chunk (several under interleaved schedules), what
// PipelineEngine (engine/pipeline_engine.h) runs on this rank.
#pragma once

#include "engine/pipeline_engine.h"
#include "examples/models/gpt.h"

namespace tessera::examples {

class GptStage final : public PipelineStageModel {
 public:
  GptStage(Gpt& gpt, Gpt::LayerRanges chunks) : gpt_(gpt), chunks_(std::move(chunks)) {}
  at::Tensor forward(const at::Tensor& input) override { return forward(0, input); }
  at::Tensor forward(int chunk, const at::Tensor& input) override {
    return gpt_.forward_layers(input, chunks_.at(chunk).first, chunks_.at(chunk).second);
  }
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets) override {
    return gpt_.loss_of_logits(logits, targets);
  }
  // The stage's MoE blocks' load-balancing losses go back with its output (engine/pipeline_engine.h).
  at::Tensor take_auxiliary_loss() override { return gpt_.take_aux_loss(); }

 private:
  Gpt& gpt_;
  Gpt::LayerRanges chunks_;
};

}  // namespace tessera::examples
