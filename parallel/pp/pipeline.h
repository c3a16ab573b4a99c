#pragma once
// The pipeline executor: runs this stage's share of a schedule (parallel/pp/schedule.h) on
// a Stage's chunks (parallel/pp/stage.h) and moves the residual stream between stages over
// the pp group. It chooses each micro-batch's activation slot: the lowest free one, or a new
// one when all are taken.
//
// Transfers: a forward of virtual stage j receives its input from j-1 and sends its output
// to j+1; a backward receives d(output) from j+1 and sends d(input) to j-1. Virtual stage j
// runs on stage j % p. Each receive is posted one pass ahead, so it arrives while the
// current pass computes; each send goes from its own buffer and is not waited for before the
// step ends, so a stage never blocks on a send. Pending transfers are polled after every
// layer. A message's tag is (micro-batch, destination virtual stage, direction), so sends
// and receives match whatever order they are posted in. With sequence parallelism the
// residual stream is already sharded over tp: only this tp rank's rows cross stages.
//
// Timeline: every pass and every wait for a transfer is a span on the trace clock
// (parallel::trace_now_ns), kept for the last `keep_steps` steps.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "parallel/comm.h"
#include "parallel/pp/schedule.h"
#include "parallel/pp/stage.h"

namespace pentad::parallel::pp {

struct Span {
  enum Kind : uint8_t { Forward, Backward, WaitInput, WaitGrad };
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

class Pipeline {
 public:
  // group: the pp group (group rank = stage); stage: this stage's chunks. Both outlive the
  // pipeline.
  Pipeline(Stage& stage, Communicator& group, const ScheduleSpec& spec, int keep_steps = 64);
  ~Pipeline();

  // Another schedule of the same stages and virtual stages (adaptive kFkB changes k).
  void set_schedule(const ScheduleSpec& spec);
  const ScheduleSpec& schedule() const { return spec_; }

  // One step: every micro-batch forward and backward, in the schedule's order. Returns the
  // sum of the micro-batches' mean losses on the stage holding the loss, 0 elsewhere.
  // on_ready hears of finished gradient ranges after each chunk's last backward.
  double train(int64_t step, const Fetch& fetch, float dloss, const GradsReady& on_ready);
  // Forward only over `count` micro-batches; the sum of their losses as train() returns it.
  double evaluate(int count, const Fetch& fetch);

  const std::vector<Span>& spans() const { return spans_; }  // of the last keep_steps() steps
  int keep_steps() const { return keep_steps_; }
  // Mean seconds of one forward and one backward of a chunk on this stage, over the last
  // train() (the inputs of the adaptive schedule's cost model).
  double forward_seconds() const { return forward_seconds_; }
  double backward_seconds() const { return backward_seconds_; }
  // Micro-batches in flight on each chunk at the peak (activation slots in use at once),
  // measured since construction.
  std::vector<int> peak_in_flight() const { return peak_; }

 private:
  struct Message {
    std::vector<float> buf;
    Work work;
  };
  int virtual_stage(const Action& a) const { return a.chunk * spec_.stages + stage_; }
  int tag(Action::Type type, int micro, int to_virtual_stage) const;
  bool needs_input(const Action& a) const;
  void post_receive(const Action& a);
  std::vector<float> take_buffer();
  Tensor wait_input(const Action& a, Span::Kind kind, int64_t step);
  void send(const Tensor& data, Action::Type type, int micro, int to_virtual_stage);
  void poll();
  void finish_sends();
  void record(Span::Kind kind, const Action& a, int64_t step, int64_t start_ns,
              int64_t start_cpu_ns);
  // One forward pass: its input received (or tokens fetched), computed, its output sent on.
  float forward(const Action& a, int slot, int64_t step, const Fetch& fetch, float dloss);
  int acquire_slot(int chunk);
  void release_slot(int chunk, int slot);

  Stage& chunks_;  // this stage's chunks
  Communicator& group_;
  ScheduleSpec spec_;
  int stage_ = 0;
  int keep_steps_;
  int64_t rows_, width_;
  std::map<std::tuple<int, int, int>, Message> receives_;  // (type, micro, chunk) posted
  std::vector<Message> sends_;                             // in flight
  std::vector<std::vector<float>> free_buffers_;
  std::vector<Span> spans_;
  std::vector<int32_t> tokens_, targets_;     // the micro-batch being fetched
  std::vector<std::vector<bool>> slot_busy_;  // per chunk, per slot the stage made
  std::vector<int> in_flight_, peak_;
  double forward_seconds_ = 0.0, backward_seconds_ = 0.0;
};

}  // namespace pentad::parallel::pp
