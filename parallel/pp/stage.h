#pragma once
// What the pipeline executor (parallel/pp/pipeline.h) drives: this stage's chunks of some
// model, as callbacks. The pipeline knows nothing of the model behind them; the parallelize
// step (src/train/parallelize.h) adapts the model to this interface.
//
// Each chunk has activation slots, numbered from 0, each holding one micro-batch between its
// forward and its backward. The pipeline chooses which slot a micro-batch uses and asks for
// another (add_slot) when every slot is taken, so the slots made are the peak number of
// micro-batches in flight. The stage's residual stream crosses stages as a (rows, width)
// tensor, boundary_shape(), in the dtype and on the device of input() and output() (F32 on
// the CPU; the compute dtype on CUDA), the same for every chunk and slot.
#include <cstdint>
#include <functional>

#include "core/tensor.h"

namespace pentad::parallel::pp {

// Called during backward with the element offset in the gradient arena from which
// gradients are final for this step (data parallelism starts reducing them).
using GradsReady = std::function<void(int64_t offset)>;

class Stage {
 public:
  virtual ~Stage() = default;
  virtual int chunks() const = 0;
  virtual Shape boundary_shape() const = 0;  // (rows, width) of what crosses stages
  virtual int slots(int chunk) const = 0;    // made so far (at least one each)
  virtual int add_slot(int chunk) = 0;       // makes one; returns its index
  // Where a received activation goes before forward, and the output sent on after it.
  virtual Tensor input(int chunk, int slot) = 0;
  virtual Tensor output(int chunk, int slot) = 0;
  // Forward of one micro-batch. tokens, targets: host (b, t) ids, read only by the chunk
  // holding the embedding and the one holding the loss (null elsewhere is fine). Returns the
  // micro-batch's mean loss on the chunk holding the loss, 0 elsewhere. dloss != 0: a
  // training forward whose backward follows (scaling the loss's gradient).
  virtual float forward(int chunk, int slot, const int32_t* tokens, const int32_t* targets,
                        float dloss) = 0;
  // Backward of the micro-batch in `slot`: from d_output (rows, width), or from the loss on
  // the chunk holding it (d_output empty). last_micro_batch: this chunk's last backward of
  // the step, after which on_ready hears of finished gradient ranges.
  virtual void backward(int chunk, int slot, const Tensor& d_output, bool last_micro_batch,
                        const GradsReady& on_ready) = 0;
  // The same backward in two passes (the zero-bubble schedules): B, d(input) from
  // d_output, and later W, the parameter gradients; the slot's activations stay until W.
  // last_micro_batch and on_ready as backward's, for W.
  virtual void backward_input(int chunk, int slot, const Tensor& d_output) = 0;
  virtual void backward_weights(int chunk, int slot, bool last_micro_batch,
                                const GradsReady& on_ready) = 0;
  // d(input) of the last backward or B, (rows, width), valid until the next one.
  virtual Tensor input_grad() = 0;
  // Called often during forward and backward (after every layer): the pipeline polls its
  // transfers there. An empty function stops the calls.
  virtual void set_progress(std::function<void()> progress) = 0;
};

}  // namespace pentad::parallel::pp
