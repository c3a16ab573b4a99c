#pragma once
// Dumps what the PyTorch reference test needs (tests/python/torch_reference.py): the
// initial weights, the batches, the first forward's logits and loss, the first step's
// gradients, and the losses of `steps` AdamW steps, all as .npy in out_dir. An MoE model
// adds each step's aux, seq-aux and z losses (moe_losses.npy, steps x 3) and its expert
// biases after the last step (final.NAME.npy).
// With a checkpoint directory, the weights are that checkpoint's instead of the
// initialisation (the Hugging Face tests compare a trained or imported model's logits).
#include <cstdint>
#include <string>

#include "recipe/config.h"

namespace pentad {

void export_reference(const Config& cfg, const std::string& out_dir, int64_t steps,
                      const std::string& checkpoint = "");

}  // namespace pentad
