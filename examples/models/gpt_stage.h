// The example GPT (gpt.h) as one pipeline stage: layers [begin, end) of its layer list (embedding,
// blocks, head), what PipelineEngine (engine/pipeline_engine.h) runs on this rank.
#pragma once

#include "engine/pipeline_engine.h"
#include "examples/models/gpt.h"

namespace tessera::examples {

class GptStage final : public PipelineStageModel {
 public:
  GptStage(Gpt& gpt, int64_t begin, int64_t end) : gpt_(gpt), begin_(begin), end_(end) {}
  at::Tensor forward(const at::Tensor& input) override { return gpt_.forward_layers(input, begin_, end_); }
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets) override {
    return gpt_.loss_of_logits(logits, targets);
  }
  // The stage's MoE blocks' load-balancing losses go back with its output (engine/pipeline_engine.h).
  at::Tensor take_auxiliary_loss() override { return gpt_.take_aux_loss(); }

 private:
  Gpt& gpt_;
  int64_t begin_, end_;
};

}  // namespace tessera::examples
