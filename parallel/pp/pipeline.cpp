#include "parallel/pp/pipeline.h"

#include <time.h>

#include <algorithm>

#include "core/check.h"

namespace pentad::parallel::pp {

const char* span_name(Span::Kind kind) {
  switch (kind) {
    case Span::Forward:
      return "forward";
    case Span::Backward:
      return "backward";
    case Span::WaitInput:
      return "wait activation";
    case Span::WaitGrad:
      return "wait gradient";
  }
  return "?";
}

Pipeline::Pipeline(Stage& stage, Communicator& group, const ScheduleSpec& spec, int keep_steps)
    : chunks_(stage), group_(group), spec_(spec), stage_(group.rank()), keep_steps_(keep_steps) {
  PENTAD_CHECK(group.size() == spec.stages, "pp group of {} ranks for {} stages", group.size(),
               spec.stages);
  PENTAD_CHECK(stage.chunks() == spec.virtual_stages, "stage holds {} chunks, schedule wants {}",
               stage.chunks(), spec.virtual_stages);
  check_schedule(spec);
  const Shape boundary = stage.boundary_shape();
  rows_ = boundary[0];
  width_ = boundary[1];
  in_flight_.assign(size_t(spec.virtual_stages), 0);
  peak_.assign(size_t(spec.virtual_stages), 0);
  for (int c = 0; c < spec.virtual_stages; ++c)
    slot_busy_.push_back(std::vector<bool>(size_t(stage.slots(c)), false));
  chunks_.set_progress([this] { poll(); });
}

Pipeline::~Pipeline() {
  chunks_.set_progress({});
}

int Pipeline::acquire_slot(int chunk) {
  std::vector<bool>& busy = slot_busy_[size_t(chunk)];
  for (size_t i = 0; i < busy.size(); ++i)
    if (!busy[i]) {
      busy[i] = true;
      return int(i);
    }
  const int slot = chunks_.add_slot(chunk);
  PENTAD_CHECK(slot == int(busy.size()), "chunk {}: new slot {}, want {}", chunk, slot,
               busy.size());
  busy.push_back(true);
  return slot;
}

void Pipeline::release_slot(int chunk, int slot) {
  std::vector<bool>& busy = slot_busy_[size_t(chunk)];
  PENTAD_CHECK(busy.at(size_t(slot)), "chunk {} slot {} released twice", chunk, slot);
  busy[size_t(slot)] = false;
}

void Pipeline::set_schedule(const ScheduleSpec& spec) {
  PENTAD_CHECK(spec.stages == spec_.stages && spec.virtual_stages == spec_.virtual_stages,
               "set_schedule: stages or virtual stages changed");
  check_schedule(spec);
  spec_ = spec;
}

int Pipeline::tag(Action::Type type, int micro, int to_virtual_stage) const {
  const int vstages = spec_.stages * spec_.virtual_stages;
  // Within MPI's guaranteed tag range (32767) for up to 63 virtual stages. Micro-batches 256
  // apart share a tag; their messages still match in order, as MPI never reorders messages
  // of one tag on one link and each stage posts its receives in micro-batch order.
  return ((micro % 256) * vstages + to_virtual_stage) * 2 + (type == Action::Backward ? 1 : 0);
}

bool Pipeline::needs_input(const Action& a) const {
  const int vs = virtual_stage(a), last = spec_.stages * spec_.virtual_stages - 1;
  return a.type == Action::Forward ? vs > 0 : vs < last;
}

std::vector<float> Pipeline::take_buffer() {
  if (free_buffers_.empty()) return std::vector<float>(size_t(rows_ * width_));
  std::vector<float> buf = std::move(free_buffers_.back());
  free_buffers_.pop_back();
  return buf;
}

void Pipeline::post_receive(const Action& a) {
  if (!needs_input(a)) return;
  const auto key = std::make_tuple(int(a.type), a.micro, a.chunk);
  if (receives_.count(key)) return;
  const int vs = virtual_stage(a), from = a.type == Action::Forward ? vs - 1 : vs + 1;
  Message m{take_buffer(), Work{}};
  m.work = group_.recv(view_of(m.buf.data(), Shape{rows_, width_}), from % spec_.stages,
                       tag(a.type, a.micro, vs), true);
  receives_.emplace(key, std::move(m));
}

// CPU time of the whole process, since a pass may run on several OpenMP threads.
static int64_t cpu_now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

Tensor Pipeline::wait_input(const Action& a, Span::Kind kind, int64_t step) {
  post_receive(a);
  auto it = receives_.find(std::make_tuple(int(a.type), a.micro, a.chunk));
  const int64_t start = trace_now_ns(), start_cpu = cpu_now_ns();
  it->second.work.wait();
  record(kind, a, step, start, start_cpu);
  // The buffer goes back to the pool once the caller has copied it (before the next post).
  free_buffers_.push_back(std::move(it->second.buf));
  receives_.erase(it);
  return view_of(free_buffers_.back().data(), Shape{rows_, width_});
}

void Pipeline::send(const Tensor& data, Action::Type type, int micro, int to_virtual_stage) {
  Message m{take_buffer(), Work{}};
  std::copy_n(data.f32(), data.numel(), m.buf.data());
  m.work = group_.send(view_of(m.buf.data(), Shape{rows_, width_}), to_virtual_stage % spec_.stages,
                       tag(type, micro, to_virtual_stage), true);
  sends_.push_back(std::move(m));
}

void Pipeline::poll() {
  for (auto& [key, m] : receives_) m.work.test();
  for (size_t i = 0; i < sends_.size();) {
    if (sends_[i].work.test()) {
      free_buffers_.push_back(std::move(sends_[i].buf));
      sends_[i] = std::move(sends_.back());
      sends_.pop_back();
    } else {
      ++i;
    }
  }
}

void Pipeline::finish_sends() {
  for (Message& m : sends_) {
    m.work.wait();
    free_buffers_.push_back(std::move(m.buf));
  }
  sends_.clear();
}

void Pipeline::record(Span::Kind kind, const Action& a, int64_t step, int64_t start_ns,
                      int64_t start_cpu_ns) {
  spans_.push_back(
      {kind, a.micro, a.chunk, step, start_ns, trace_now_ns(), cpu_now_ns() - start_cpu_ns});
}

float Pipeline::forward(const Action& a, int slot, int64_t step, const Fetch& fetch, float dloss) {
  const int vs = virtual_stage(a), last_vs = spec_.stages * spec_.virtual_stages - 1;
  if (needs_input(a)) {
    const Tensor in = wait_input(a, Span::WaitInput, step);
    Tensor dst = chunks_.input(a.chunk, slot);
    std::copy_n(in.f32(), in.numel(), dst.f32());
  }
  // The embedding is on virtual stage 0, the loss on the last.
  if (vs == 0 || vs == last_vs) fetch(a.micro, tokens_, targets_);
  const int64_t start = trace_now_ns(), start_cpu = cpu_now_ns();
  const float loss = chunks_.forward(a.chunk, slot, tokens_.data(), targets_.data(), dloss);
  record(Span::Forward, a, step, start, start_cpu);
  if (vs < last_vs) send(chunks_.output(a.chunk, slot), Action::Forward, a.micro, vs + 1);
  return loss;
}

double Pipeline::train(int64_t step, const Fetch& fetch, float dloss, const GradsReady& on_ready) {
  // Keep the spans of the last keep_steps_ steps.
  if (!spans_.empty() && spans_.back().step - spans_.front().step + 1 >= keep_steps_) {
    const int64_t first_kept = step - keep_steps_ + 1;
    spans_.erase(spans_.begin(), std::find_if(spans_.begin(), spans_.end(),
                                              [&](const Span& s) { return s.step >= first_kept; }));
  }
  const std::vector<Action> actions = stage_actions(spec_, stage_);
  std::vector<size_t> last_backward(size_t(spec_.virtual_stages), 0);
  for (size_t i = 0; i < actions.size(); ++i)
    if (actions[i].type == Action::Backward) last_backward[size_t(actions[i].chunk)] = i;
  std::map<std::pair<int, int>, int> slot_of;  // (micro, chunk) -> activation slot
  double loss = 0.0, forward_ns = 0.0, backward_ns = 0.0;
  int forwards = 0, backwards = 0;
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const int vs = virtual_stage(a);
    if (i + 1 < actions.size()) post_receive(actions[i + 1]);  // arrives while this one runs
    if (a.type == Action::Forward) {
      const int slot = acquire_slot(a.chunk);
      slot_of[{a.micro, a.chunk}] = slot;
      int& alive = in_flight_[size_t(a.chunk)];
      peak_[size_t(a.chunk)] = std::max(peak_[size_t(a.chunk)], ++alive);
      loss += forward(a, slot, step, fetch, dloss);
      forward_ns += double(spans_.back().end_ns - spans_.back().start_ns);
      ++forwards;
    } else {
      const int slot = slot_of.at({a.micro, a.chunk});
      Tensor d_output;
      if (needs_input(a)) d_output = wait_input(a, Span::WaitGrad, step);
      const int64_t start = trace_now_ns(), start_cpu = cpu_now_ns();
      chunks_.backward(a.chunk, slot, d_output, i == last_backward[size_t(a.chunk)], on_ready);
      record(Span::Backward, a, step, start, start_cpu);
      backward_ns += double(spans_.back().end_ns - start);
      ++backwards;
      if (vs > 0) send(chunks_.input_grad(), Action::Backward, a.micro, vs - 1);
      release_slot(a.chunk, slot);
      --in_flight_[size_t(a.chunk)];
    }
    poll();
  }
  finish_sends();
  forward_seconds_ = forwards ? forward_ns / forwards * 1e-9 : 0.0;
  backward_seconds_ = backwards ? backward_ns / backwards * 1e-9 : 0.0;
  return loss;
}

double Pipeline::evaluate(int count, const Fetch& fetch) {
  // Forward only, micro-batch by micro-batch through the chunks: activations are dropped
  // as soon as they are sent on.
  std::vector<Action> actions;
  for (int micro = 0; micro < count; ++micro)
    for (int c = 0; c < spec_.virtual_stages; ++c) actions.push_back({Action::Forward, micro, c});
  double loss = 0.0;
  const size_t kept = spans_.size();
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (i + 1 < actions.size()) post_receive(actions[i + 1]);
    const int slot = acquire_slot(a.chunk);
    loss += forward(a, slot, -1, fetch, 0.0f);
    release_slot(a.chunk, slot);
    poll();
  }
  finish_sends();
  spans_.resize(kept);  // the timeline is of training steps
  return loss;
}

}  // namespace pentad::parallel::pp
