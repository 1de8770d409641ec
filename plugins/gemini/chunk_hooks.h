#pragma once
// The hooks Gemini installs on a model: on the model's building blocks (model::ParameterUse) the
// chunks each block computes with are brought in before its forward and again before its backward;
// on each trainable tensor (autograd's post-accumulate hook) the plugin hears of each gradient as
// it lands. What "bring in" means — read from disk or copy to the device, or all-gather a sharded
// chunk — and what a gradient's arrival does stay the plugin's.
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/layers.h"
#include "plugins/gemini/tensor_entries.h"

namespace tessera::plugins {

using BlockChunks = std::unordered_map<const torch::nn::Module*, std::vector<std::size_t>>;

// For each block, the chunks of its entries that `wanted` keeps, each once, in the entries'
// order (chunk_of(entry) → chunk); blocks left with none are not listed.
template <class ChunkOf, class Wanted>
BlockChunks chunks_by_block(const std::vector<BlockEntries>& blocks, ChunkOf&& chunk_of,
                            Wanted&& wanted) {
  BlockChunks out;
  for (const BlockEntries& b : blocks) {
    std::vector<std::size_t> chunks;
    for (std::size_t i : b.entries) {
      const std::optional<std::size_t> c = chunk_of(i);
      if (c && wanted(*c) && std::find(chunks.begin(), chunks.end(), *c) == chunks.end())
        chunks.push_back(*c);
    }
    if (!chunks.empty()) out[b.block.get()] = std::move(chunks);
  }
  return out;
}

// The blocks whose hook slot a plugin set; remove() empties those slots again (the model can
// outlive the plugin: a trainer keeps it for export).
class HookedBlocks {
 public:
  void set(const std::vector<BlockEntries>& blocks, const BlockChunks& which,
           const std::shared_ptr<model::ParameterUse>& hook) {
    for (const BlockEntries& b : blocks)
      if (which.count(b.block.get())) {
        *parameter_use_slot(*b.block) = hook;
        blocks_.push_back(b.block);
      }
  }
  void remove() {
    for (const auto& block : blocks_)
      if (auto* slot = parameter_use_slot(*block)) *slot = nullptr;
    blocks_.clear();
  }

 private:
  std::vector<std::shared_ptr<torch::nn::Module>> blocks_;
};

// Brings a block's chunks in as it starts computing (`use`) and again as its output's gradient
// arrives, just before its backward, when the block needs its parameters there; `unpin` runs as
// its forward ends (the chunks may go once others need the room).
class ChunkUseHook : public model::ParameterUse {
 public:
  using Use = std::function<void(const std::vector<std::size_t>&)>;

  ChunkUseHook(BlockChunks chunks, Use use, std::function<void()> unpin)
      : chunks_(std::move(chunks)), use_(std::move(use)), unpin_(std::move(unpin)) {}

  const BlockChunks& chunks() const { return chunks_; }

  void enter(const torch::nn::Module& block) override { use_(chunks_.at(&block)); }

  torch::Tensor leave(const torch::nn::Module& block, torch::Tensor output,
                      bool needs_parameters_in_backward) override {
    unpin_();
    if (needs_parameters_in_backward && output.requires_grad()) {
      const std::vector<std::size_t>* chunks = &chunks_.at(&block);
      output.register_hook([this, chunks](const torch::Tensor&) { use_(*chunks); });
    }
    return output;
  }

 private:
  BlockChunks chunks_;
  Use use_;
  std::function<void()> unpin_;
};

// Calls `enter(block)` as a block starts computing (a wait for its parameters), nothing after.
class BlockEnterHook : public model::ParameterUse {
 public:
  explicit BlockEnterHook(std::function<void(const torch::nn::Module&)> enter)
      : enter_(std::move(enter)) {}
  void enter(const torch::nn::Module& block) override { enter_(block); }
  torch::Tensor leave(const torch::nn::Module&, torch::Tensor output, bool) override {
    return output;
  }

 private:
  std::function<void(const torch::nn::Module&)> enter_;
};

// Calls `arrived(entry, tensor)` after autograd accumulated a gradient into `tensor`'s .grad.
class GradientArrival : public torch::autograd::PostAccumulateGradHook {
 public:
  using Arrived = std::function<void(std::size_t, const torch::autograd::Variable&)>;
  GradientArrival(Arrived arrived, std::size_t entry)
      : arrived_(std::move(arrived)), entry_(entry) {}
  void operator()(const torch::autograd::Variable& tensor) override { arrived_(entry_, tensor); }

 private:
  Arrived arrived_;
  std::size_t entry_;
};

// Installs a GradientArrival on each entry of `order` (the trainable ones).
template <class Entry>
void install_gradient_hooks(std::vector<Entry>& entries, const std::vector<std::size_t>& order,
                            const GradientArrival::Arrived& arrived) {
  for (std::size_t i : order)
    torch::autograd::impl::set_post_acc_grad_hooks(entries[i].tensor,
                                                   std::make_unique<GradientArrival>(arrived, i));
}

template <class Entry>
void remove_gradient_hooks(std::vector<Entry>& entries, const std::vector<std::size_t>& order) {
  for (std::size_t i : order)
    torch::autograd::impl::set_post_acc_grad_hooks(entries[i].tensor, nullptr);
}

}  // namespace tessera::plugins
