#include "parallel/pp/pipeline.h"

#include <time.h>

#include <algorithm>

#include "core/check.h"
#include "core/device_memory.h"

namespace pentad::parallel::pp {

namespace {

// Evaluation's passes: every micro-batch through every chunk, on every stage alike.
std::vector<Action> evaluation_actions(int count, int chunks) {
  std::vector<Action> actions;
  for (int micro = 0; micro < count; ++micro)
    for (int c = 0; c < chunks; ++c) actions.push_back({Action::Forward, micro, c});
  return actions;
}

}  // namespace

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
    case Span::BackwardInput:
      return "backward input";
    case Span::BackwardWeight:
      return "backward weight";
  }
  return "?";
}

Pipeline::Pipeline(Stage& stage, Communicator& group, const ScheduleSpec& spec, int keep_steps,
                   Posting posting)
    : chunks_(stage), group_(group), spec_(spec), stage_(group.rank()), keep_steps_(keep_steps) {
  PENTAD_CHECK(group.size() == spec.stages, "pp group of {} ranks for {} stages", group.size(),
               spec.stages);
  PENTAD_CHECK(stage.chunks() == spec.virtual_stages, "stage holds {} chunks, schedule wants {}",
               stage.chunks(), spec.virtual_stages);
  check_schedule(spec);
  const Shape boundary = stage.boundary_shape();
  rows_ = boundary[0];
  width_ = boundary[1];
  const Tensor sample = stage.input(0, 0);
  dtype_ = sample.dtype;
  device_ = sample.device;
  rounds_mode_ = device_ != Device::CPU || posting == Posting::Rounds;
  set_schedule(spec);
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
  PENTAD_CHECK(spec.stages == spec_.stages && spec.virtual_stages == spec_.virtual_stages &&
                   spec.placement().vee == spec_.placement().vee,
               "set_schedule: stages, virtual stages or their placement changed");
  check_schedule(spec);
  spec_ = spec;
  const std::vector<std::vector<Action>> lists = schedule_actions(spec);
  actions_ = lists[size_t(stage_)];
  if (rounds_mode_) train_rounds_ = {plan_rounds(lists, spec.placement(), stage_), 0};
}

int Pipeline::tag(Action::Type type, int micro, int to_virtual_stage) const {
  const int vstages = spec_.stages * spec_.virtual_stages;
  // Within MPI's guaranteed tag range (32767) for up to 63 virtual stages. Micro-batches 256
  // apart share a tag; their messages still match in order, as MPI never reorders messages
  // of one tag on one link and each stage posts its receives in micro-batch order.
  return ((micro % 256) * vstages + to_virtual_stage) * 2 + (type == Action::Backward ? 1 : 0);
}

bool Pipeline::needs_input(const Action& a) const {
  if (a.type == Action::Weight) return false;
  const int vs = virtual_stage(a), last = spec_.stages * spec_.virtual_stages - 1;
  return a.type == Action::Forward ? vs > 0 : vs < last;
}

Pipeline::Buffer Pipeline::take_buffer() {
  if (free_buffers_.empty()) {
    const Shape shape{rows_, width_};
    Buffer buf;
    buf.arena = std::make_unique<Arena>("pipeline transfer",
                                        size_t(shape.numel()) * dtype_bytes(dtype_), device_);
    buf.tensor = buf.arena->alloc(shape, dtype_);
    return buf;
  }
  Buffer buf = std::move(free_buffers_.back());
  free_buffers_.pop_back();
  return buf;
}

void Pipeline::post_rounds(Rounds& rounds, int until) {
  const int last = std::min(until, int(rounds.plan.groups.size()) - 1);
  for (; rounds.posted <= last; ++rounds.posted) {
    const std::vector<Transfer>& group = rounds.plan.groups[size_t(rounds.posted)];
    if (group.empty()) continue;
    std::vector<P2POp> ops;
    std::vector<std::pair<bool, std::tuple<int, int, int>>> keys;  // (is_send, key) per op
    std::vector<Buffer> buffers;
    for (const Transfer& t : group) {
      const int tg = tag(t.type, t.micro, t.to_virtual_stage);
      if (t.from_stage == stage_) {
        auto it = unposted_sends_.find({int(t.type), t.micro, t.to_virtual_stage});
        PENTAD_CHECK(it != unposted_sends_.end(),
                     "round {}: the send of micro-batch {} to "
                     "virtual stage {} was not computed",
                     rounds.posted, t.micro, t.to_virtual_stage);
        buffers.push_back(std::move(it->second));
        unposted_sends_.erase(it);
        ops.push_back({true, buffers.back().tensor, t.to_stage, tg});
        keys.push_back({true, {}});
      }
      if (t.to_stage == stage_) {
        buffers.push_back(take_buffer());
        ops.push_back({false, buffers.back().tensor, t.from_stage, tg});
        keys.push_back({false, {int(t.type), t.micro, t.to_virtual_stage / spec_.stages}});
      }
    }
    std::vector<Work> works = group_.batch_p2p(ops);
    for (size_t i = 0; i < works.size(); ++i) {
      Message m{std::move(buffers[i]), std::move(works[i])};
      if (keys[i].first)
        sends_.push_back(std::move(m));
      else
        receives_.emplace(keys[i].second, std::move(m));
    }
  }
}

void Pipeline::post_receive(const Action& a) {
  if (rounds_mode_ || !needs_input(a)) return;  // device transfers: posted in rounds
  const auto key = std::make_tuple(int(carried(a.type)), a.micro, a.chunk);
  if (receives_.count(key)) return;
  const int vs = virtual_stage(a), from = a.type == Action::Forward ? vs - 1 : vs + 1;
  Message m{take_buffer(), Work{}};
  m.work = group_.recv(m.buf.tensor, spec_.placement().stage_of(from),
                       tag(carried(a.type), a.micro, vs), true);
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
  auto it = receives_.find(std::make_tuple(int(carried(a.type)), a.micro, a.chunk));
  PENTAD_CHECK(it != receives_.end(), "the input of micro-batch {} chunk {} was never posted",
               a.micro, a.chunk);
  const int64_t start = trace_now_ns(), start_cpu = cpu_now_ns();
  it->second.work.wait();
  record(kind, a, step, start, start_cpu);
  // The buffer goes back to the pool once the caller has copied it (before the next post).
  // (On a device the copy is queued on the compute stream, behind the wait, and any later
  // transfer into the buffer waits for the compute stream: comm.h's stream rule.)
  free_buffers_.push_back(std::move(it->second.buf));
  receives_.erase(it);
  return free_buffers_.back().tensor;
}

void Pipeline::send(const Tensor& data, Action::Type type, int micro, int to_virtual_stage) {
  Buffer buf = take_buffer();
  copy(buf.tensor, data);
  if (rounds_mode_) {  // posted with its round's group (post_rounds)
    unposted_sends_.emplace(std::make_tuple(int(type), micro, to_virtual_stage), std::move(buf));
    return;
  }
  Message m{std::move(buf), Work{}};
  m.work = group_.send(m.buf.tensor, spec_.placement().stage_of(to_virtual_stage),
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
  PENTAD_CHECK(unposted_sends_.empty(), "{} sends were never posted", unposted_sends_.size());
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
    copy(chunks_.input(a.chunk, slot), in);
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
  const std::vector<Action>& actions = actions_;
  // Each chunk's last pass that finishes gradients: its last backward, or W.
  std::vector<size_t> last_backward(size_t(spec_.virtual_stages), 0);
  for (size_t i = 0; i < actions.size(); ++i)
    if (actions[i].type == Action::Backward || actions[i].type == Action::Weight)
      last_backward[size_t(actions[i].chunk)] = i;
  std::map<std::pair<int, int>, int> slot_of;  // (micro, chunk) -> activation slot
  double loss = 0.0;
  // Per chunk: nanoseconds in forwards, in backwards or Bs, in Ws; forwards run.
  std::vector<double> ns(3 * size_t(spec_.virtual_stages), 0.0);
  std::vector<int> forwards(size_t(spec_.virtual_stages), 0);
  train_rounds_.posted = 0;
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const int round = rounds_mode_ ? train_rounds_.plan.round_of_action[i] : 0;
    if (rounds_mode_) post_rounds(train_rounds_, round - 1);   // the rounds this stage idled
    if (i + 1 < actions.size()) post_receive(actions[i + 1]);  // arrives while this one runs
    if (a.type == Action::Forward) {
      const int slot = acquire_slot(a.chunk);
      slot_of[{a.micro, a.chunk}] = slot;
      int& alive = in_flight_[size_t(a.chunk)];
      peak_[size_t(a.chunk)] = std::max(peak_[size_t(a.chunk)], ++alive);
      loss += forward(a, slot, step, fetch, dloss);
      ns[3 * size_t(a.chunk)] += double(spans_.back().end_ns - spans_.back().start_ns);
      ++forwards[size_t(a.chunk)];
    } else {
      const int slot = slot_of.at({a.micro, a.chunk});
      ns[3 * size_t(a.chunk) + (a.type == Action::Weight ? 2 : 1)] +=
          backward(a, slot, step, i == last_backward[size_t(a.chunk)], on_ready);
      if (a.type != Action::Input) {  // the slot is free once its gradients are taken
        release_slot(a.chunk, slot);
        --in_flight_[size_t(a.chunk)];
      }
    }
    if (rounds_mode_) post_rounds(train_rounds_, round);
    poll();
  }
  if (rounds_mode_) post_rounds(train_rounds_, int(train_rounds_.plan.groups.size()));
  finish_sends();
  pass_seconds_.assign(ns.size(), 0.0);  // a backward (or B and W) per forward
  for (size_t i = 0; i < ns.size(); ++i)
    if (const int n = forwards[i / 3]; n > 0) pass_seconds_[i] = ns[i] / n * 1e-9;
  return loss;
}

double Pipeline::backward(const Action& a, int slot, int64_t step, bool last_of_chunk,
                          const GradsReady& on_ready) {
  const int vs = virtual_stage(a);
  Tensor d_output;
  if (needs_input(a)) d_output = wait_input(a, Span::WaitGrad, step);
  const int64_t start = trace_now_ns(), start_cpu = cpu_now_ns();
  Span::Kind kind = Span::Backward;
  const bool grads = a.type != Action::Input;  // the pass finishes parameter gradients
  if (grads && before_grads_) before_grads_(a.chunk);
  if (a.type == Action::Backward) {
    chunks_.backward(a.chunk, slot, d_output, last_of_chunk, on_ready);
  } else if (a.type == Action::Input) {
    chunks_.backward_input(a.chunk, slot, d_output);
    kind = Span::BackwardInput;
  } else {
    chunks_.backward_weights(a.chunk, slot, last_of_chunk, on_ready);
    kind = Span::BackwardWeight;
  }
  record(kind, a, step, start, start_cpu);
  const double ns = double(spans_.back().end_ns - start);
  if (a.type != Action::Weight && vs > 0)
    send(chunks_.input_grad(), Action::Backward, a.micro, vs - 1);
  if (grads && after_grads_) after_grads_(a.chunk);  // after the send: the stage below goes on
  return ns;
}

double Pipeline::evaluate(int count, const Fetch& fetch) {
  // Forward only, micro-batch by micro-batch through the chunks: activations are dropped
  // as soon as they are sent on.
  const std::vector<Action> actions = evaluation_actions(count, spec_.virtual_stages);
  Rounds* rounds = nullptr;
  if (rounds_mode_) {
    auto it = eval_rounds_.find(count);
    if (it == eval_rounds_.end()) {
      const std::vector<std::vector<Action>> lists(size_t(spec_.stages), actions);
      it = eval_rounds_.emplace(count, Rounds{plan_rounds(lists, spec_.placement(), stage_), 0})
               .first;
    }
    rounds = &it->second;
    rounds->posted = 0;
  }
  double loss = 0.0;
  const size_t kept = spans_.size();
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const int round = rounds ? rounds->plan.round_of_action[i] : 0;
    if (rounds) post_rounds(*rounds, round - 1);
    if (i + 1 < actions.size()) post_receive(actions[i + 1]);
    const int slot = acquire_slot(a.chunk);
    loss += forward(a, slot, -1, fetch, 0.0f);
    release_slot(a.chunk, slot);
    if (rounds) post_rounds(*rounds, round);
    poll();
  }
  if (rounds) post_rounds(*rounds, int(rounds->plan.groups.size()));
  finish_sends();
  spans_.resize(kept);  // the timeline is of training steps
  return loss;
}

}  // namespace pentad::parallel::pp
