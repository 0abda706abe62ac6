// The global gradient norm, overflow and clipping of one optimizer step.
//
// The norm is over the WHOLE model's gradients, ‖g‖ = sqrt(Σ g²), while each rank holds only a
// part of them. Each piece of the sum is reduced over the groups across which it is split, and
// counted once across the groups that hold copies of it:
//   data-sharded (ZeRO 1–2 shards)       summed over the data group; whole copies (stage 0) once
//   tensor-sharded (tensor-parallel)     summed over the tensor group; replicated weights once
//   pipeline stages                      always summed over the pipe group (disjoint layers)
// A part reduced over a communicator of its own (GradPart::group, a ZeRO group over a factor of the
// data axis or a product of axes; never the tensor or pipe axes) is summed over the world with
// weight 1/copies: copies = the ranks holding the same values (its group's size when whole, 1 when
// sharded over it; × the tensor group's size when replicated there), since outside its group the
// ranks hold other parameters (other experts, other stages).
// Copies are identical where they are counted once (stage 0's gradients were allreduced; replicated
// weights get the same gradient on every tensor rank), so a non-finite gradient anywhere makes the
// total non-finite on every rank: that is the overflow check (one host read per step). Clipping follows DeepSpeed and torch.nn.utils.clip_grad_norm_:
// multiply by clip / (‖g‖ + 1e-6) when ‖g‖ > clip.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace tessera {

class Communicator;

struct GradPart {
  at::Tensor grads;             // a flat view of gradients this rank holds
  bool data_sharded = false;    // this rank holds 1/N of it (ZeRO 1–2), the data group the rest
  bool tensor_sharded = false;  // a tensor-parallel slice; the tensor group holds the other slices
  // ‖grads‖ (a 0-d fp32 tensor) when it was already taken, as ZeRO does the moment a bucket's
  // reduction completes during backward; undefined: global_grad_sumsq takes it.
  at::Tensor norm;
  // False for a copy whose twin another pipeline stage counts (a weight tied across stages: both
  // hold the same summed gradient); left out of the sum here.
  bool counted = true;
  // The communicator its gradients were reduced over (ZeroGroup::comm) when that is not
  // NormGroups::data; null: the data group's.
  Communicator* group = nullptr;
};

// The groups a norm reduces over; a null or single-rank group is skipped.
struct NormGroups {
  Communicator* data = nullptr;
  Communicator* tensor = nullptr;
  Communicator* pipe = nullptr;
  // Parts on groups of their own (GradPart::group) are summed over it; set on every rank when any
  // rank has such parts (one more scalar allreduce), null otherwise.
  Communicator* world = nullptr;
};

// ‖grads‖₂ as a 0-d fp32 tensor on their device, in fp32 whatever their dtype (bf16 accumulation
// would round the norm).
at::Tensor gradient_norm(const at::Tensor& grads);

// Σ g² over the whole model, the same value on every rank (non-finite on overflow). The parts'
// sums are taken on their device (or read from `norm`); one host read at the end.
double global_grad_sumsq(const std::vector<GradPart>& parts, const NormGroups& groups);

// The factor clipping multiplies the gradients by (1 when clip <= 0 or the norm is within it).
double clip_coefficient(double grad_norm, double clip);

}  // namespace tessera
