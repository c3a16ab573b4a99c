#pragma once
// The pipeline executor: runs this stage's share of a schedule (parallel/pp/schedule.h) on
// a Stage's chunks (parallel/pp/stage.h) and moves the residual stream between stages over
// the pp group. It chooses each micro-batch's activation slot: the lowest free one, or a new
// one when all are taken.
//
// Transfers: a forward of virtual stage j receives its input from j-1 and sends its output
// to j+1; a backward (or a B) receives d(output) from j+1 and sends d(input) to j-1; a W
// moves nothing. Virtual stage j runs on the stage the schedule's placement says (j % p,
// or the V of zb-v). Each receive is posted one pass ahead, so it arrives while the
// current pass computes; each send goes from its own buffer and is not waited for before the
// step ends, so a stage never blocks on a send. Pending transfers are polled after every
// layer. A message's tag is (micro-batch, destination virtual stage, direction), so sends
// and receives match whatever order they are posted in. With sequence parallelism the
// residual stream is already sharded over tp: only this tp rank's rows cross stages.
//
// Device tensors (the stage's boundary on CUDA) go through NCCL, which matches transfers by
// posting order instead of tags and runs them in that order: there the transfers are posted
// in rounds (parallel/pp/rounds.h), one group per round after that round's pass, the same
// order on both ends of every link. Buffers live where the boundary does, in its dtype;
// waiting for a device transfer orders the compute stream after it without blocking the host
// (parallel/comm.h), so the spans of the timeline measure the host's issue time there.
//
// Timeline: every pass and every wait for a transfer is a span on the trace clock
// (parallel::trace_now_ns), kept for the last `keep_steps` steps.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm.h"
#include "parallel/pp/rounds.h"
#include "parallel/pp/schedule.h"
#include "parallel/pp/stage.h"

namespace pentad::parallel::pp {

struct Span {
  // BackwardInput, BackwardWeight: a split backward's B and W.
  enum Kind : uint8_t { Forward, Backward, WaitInput, WaitGrad, BackwardInput, BackwardWeight };
  Kind kind = Forward;
  int micro = 0, chunk = 0;
  int64_t step = 0;
  int64_t start_ns = 0, end_ns = 0;
  // CPU time of this process (all its threads) during the span: below the wall time when
  // the rank waited for a core that other processes held.
  int64_t cpu_ns = 0;
};
const char* span_name(Span::Kind kind);

// Fills micro-batch `micro`'s (b, t) tokens and targets.
using Fetch =
    std::function<void(int micro, std::vector<int32_t>& tokens, std::vector<int32_t>& targets)>;

// How transfers are posted: in rounds when the boundary is on a device (NCCL's order), one
// pass ahead otherwise (MPI's tags). Rounds forces rounds on host tensors too, so that the
// CPU tests run the device order (over MPI).
enum class Posting { ByDevice, Rounds };

class Pipeline {
 public:
  // group: the pp group (group rank = stage); stage: this stage's chunks. Both outlive the
  // pipeline.
  Pipeline(Stage& stage, Communicator& group, const ScheduleSpec& spec, int keep_steps = 64,
           Posting posting = Posting::ByDevice);
  ~Pipeline();

  // Another schedule of the same stages and virtual stages (adaptive kFkB changes k).
  void set_schedule(const ScheduleSpec& spec);
  const ScheduleSpec& schedule() const { return spec_; }
  // Called before and after every pass that finishes parameter gradients of a chunk (a
  // backward or a W), with the chunk: ZeRO-2 and -3 reduce them after each
  // (train/grad_sync.h). Unset: nothing is called.
  using GradPass = std::function<void(int chunk)>;
  void set_grad_passes(GradPass before, GradPass after) {
    before_grads_ = std::move(before);
    after_grads_ = std::move(after);
  }

  // One step: every micro-batch forward and backward, in the schedule's order. Returns the
  // sum of the micro-batches' mean losses on the stage holding the loss, 0 elsewhere.
  // on_ready hears of finished gradient ranges after each chunk's last backward.
  double train(int64_t step, const Fetch& fetch, float dloss, const GradsReady& on_ready);
  // Forward only over `count` micro-batches; the sum of their losses as train() returns it.
  double evaluate(int count, const Fetch& fetch);

  const std::vector<Span>& spans() const { return spans_; }  // of the last keep_steps() steps
  int keep_steps() const { return keep_steps_; }
  // Per chunk of this stage, the mean seconds of one micro-batch's forward, its backward's B
  // (the whole backward where it is not split) and its W (0 where not split), over the last
  // train(): 3 * v values, chunk c's at 3 * c (the adaptive schedules' cost model's inputs).
  const std::vector<double>& pass_seconds() const { return pass_seconds_; }
  // Micro-batches in flight on each chunk at the peak (activation slots in use at once),
  // measured since construction.
  std::vector<int> peak_in_flight() const { return peak_; }

 private:
  // A (rows, width) transfer buffer in the boundary's dtype, on its device.
  struct Buffer {
    std::unique_ptr<Arena> arena;
    Tensor tensor;
  };
  struct Message {
    Buffer buf;
    Work work;
  };
  // The rounds of device transfers for one list of actions per stage (rounds.h), and how
  // far this stage has posted them.
  struct Rounds {
    RoundPlan plan;
    int posted = 0;  // rounds [0, posted) are posted
  };
  int virtual_stage(const Action& a) const {
    return spec_.placement().virtual_stage(stage_, a.chunk);
  }
  int tag(Action::Type type, int micro, int to_virtual_stage) const;
  bool needs_input(const Action& a) const;
  void post_receive(const Action& a);
  Buffer take_buffer();
  // Device transfers: posts the groups of rounds [rounds.posted, until] (rounds.h).
  void post_rounds(Rounds& rounds, int until);
  Tensor wait_input(const Action& a, Span::Kind kind, int64_t step);
  void send(const Tensor& data, Action::Type type, int micro, int to_virtual_stage);
  void poll();
  void finish_sends();
  void record(Span::Kind kind, const Action& a, int64_t step, int64_t start_ns,
              int64_t start_cpu_ns);
  // One forward pass: its input received (or tokens fetched), computed, its output sent on.
  float forward(const Action& a, int slot, int64_t step, const Fetch& fetch, float dloss);
  // One backward, B or W; returns its span's nanoseconds.
  double backward(const Action& a, int slot, int64_t step, bool last_of_chunk,
                  const GradsReady& on_ready);
  int acquire_slot(int chunk);
  void release_slot(int chunk, int slot);

  Stage& chunks_;  // this stage's chunks
  Communicator& group_;
  ScheduleSpec spec_;
  std::vector<Action> actions_;  // this stage's list for spec_
  int stage_ = 0;
  int keep_steps_;
  int64_t rows_, width_;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
  bool rounds_mode_ = false;  // device tensors: posted in rounds, not one pass ahead
  Rounds train_rounds_;
  std::map<int, Rounds> eval_rounds_;                      // per micro-batch count
  std::map<std::tuple<int, int, int>, Message> receives_;  // (type, micro, chunk) posted
  std::vector<Message> sends_;                             // in flight
  // Device transfers: sends copied into their buffers, waiting for their round's group;
  // key (type, micro, to_virtual_stage).
  std::map<std::tuple<int, int, int>, Buffer> unposted_sends_;
  std::vector<Buffer> free_buffers_;
  std::vector<Span> spans_;
  std::vector<int32_t> tokens_, targets_;     // the micro-batch being fetched
  std::vector<std::vector<bool>> slot_busy_;  // per chunk, per slot the stage made
  std::vector<int> in_flight_, peak_;
  std::vector<double> pass_seconds_;
  GradPass before_grads_, after_grads_;
};

}  // namespace pentad::parallel::pp
