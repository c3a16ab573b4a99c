#pragma once
// Dumps what the PyTorch reference test needs (tests/python/torch_reference.py): the
// initial weights, the batches, the first forward's logits and loss, the first step's
// gradients, and the losses of `steps` AdamW steps, all as .npy in out_dir.
// With a checkpoint directory, the weights are that checkpoint's instead of the
// initialisation (the Hugging Face tests compare a trained or imported model's logits).
#include <cstdint>
#include <string>

#include "train/config.h"

namespace pentad {

void export_reference(const Config& cfg, const std::string& out_dir, int64_t steps,
                      const std::string& checkpoint = "");

}  // namespace pentad
