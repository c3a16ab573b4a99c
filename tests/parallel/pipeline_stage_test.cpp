// The pipeline executor drives any Stage (parallel/pp/stage.h), not only a model: a toy
// stage whose virtual stage j adds j + 1 to every value and doubles the gradient on its way
// back. Every micro-batch's loss, the gradient reaching the first virtual stage, the
// activation slots made and the ready callbacks are known in closed form.
#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

#include "parallel/comm.h"
#include "parallel/pp/pipeline.h"

using namespace pentad;
using namespace pentad::parallel;

namespace {

constexpr int64_t kRows = 2, kWidth = 3, kN = kRows * kWidth;

class AddStage final : public pp::Stage {
 public:
  AddStage(int stage, const pp::ChunkPlacement& place)
      : stage_(stage), place_(place), slots_(size_t(place.chunks)) {
    for (auto& s : slots_) s.emplace_back();  // one slot each from the start, as the model
  }
  int chunks() const override { return int(slots_.size()); }
  Shape boundary_shape() const override { return Shape{kRows, kWidth}; }
  int slots(int chunk) const override { return int(slots_[size_t(chunk)].size()); }
  int add_slot(int chunk) override {
    slots_[size_t(chunk)].emplace_back();
    return slots(chunk) - 1;
  }
  Tensor input(int chunk, int slot) override { return view(at(chunk, slot).in); }
  Tensor output(int chunk, int slot) override { return view(at(chunk, slot).out); }
  float forward(int chunk, int slot, const int32_t* tokens, const int32_t*, float dloss) override {
    Slot& s = at(chunk, slot);
    const int vs = place_.virtual_stage(stage_, chunk);
    if (vs == 0) s.in.assign(kN, float(tokens[0]));
    for (int64_t i = 0; i < kN; ++i) s.out[size_t(i)] = s.in[size_t(i)] + float(vs + 1);
    s.dloss = dloss;
    if (vs != last_virtual_stage()) return 0.0f;
    float sum = 0.0f;
    for (float x : s.out) sum += x;
    return sum / float(kN);
  }
  void backward(int chunk, int slot, const Tensor& d_output, bool last_micro_batch,
                const pp::GradsReady& on_ready) override {
    backward_input(chunk, slot, d_output);
    backward_weights(chunk, slot, last_micro_batch, on_ready);
  }
  void backward_input(int chunk, int slot, const Tensor& d_output) override {
    Slot& s = at(chunk, slot);
    EXPECT_FALSE(s.weights_pending) << "a second B before W";
    const int vs = place_.virtual_stage(stage_, chunk);
    for (int64_t i = 0; i < kN; ++i)
      grad_[size_t(i)] =
          2.0f * (vs == last_virtual_stage() ? s.dloss / float(kN) : d_output.f32()[i]);
    if (vs == 0) first_grads.push_back(grad_[0]);
    s.weights_pending = true;
    if (progress_) progress_();
  }
  void backward_weights(int chunk, int slot, bool last_micro_batch,
                        const pp::GradsReady& on_ready) override {
    Slot& s = at(chunk, slot);
    EXPECT_TRUE(s.weights_pending) << "W without its B";
    s.weights_pending = false;
    if (last_micro_batch && on_ready) on_ready(chunk);
  }
  Tensor input_grad() override { return view(grad_); }
  void set_progress(std::function<void()> progress) override { progress_ = std::move(progress); }

  std::vector<float> first_grads;  // d(input) of every backward of virtual stage 0

 private:
  struct Slot {
    std::vector<float> in = std::vector<float>(kN), out = std::vector<float>(kN);
    float dloss = 0.0f;
    bool weights_pending = false;
  };
  int last_virtual_stage() const { return place_.virtual_stages() - 1; }
  Slot& at(int chunk, int slot) { return slots_[size_t(chunk)].at(size_t(slot)); }
  static Tensor view(std::vector<float>& v) { return view_of(v.data(), Shape{kRows, kWidth}); }

  int stage_;
  pp::ChunkPlacement place_;
  std::vector<std::vector<Slot>> slots_;
  std::vector<float> grad_ = std::vector<float>(kN);
  std::function<void()> progress_;
};

}  // namespace

TEST(PipelineStage, DrivesAnyStageInClosedForm) {
  auto group = make_communicator(Backend::MPI, MPI_COMM_WORLD, "pp");
  const int p = group->size(), stage = group->rank(), m = 4 * p;
  // Posted one pass ahead (host tensors), and in rounds (device tensors' order, rounds.h).
  for (const pp::Posting posting : {pp::Posting::ByDevice, pp::Posting::Rounds})
    for (const pp::ScheduleSpec& spec :
         {pp::ScheduleSpec{pp::ScheduleKind::OneFOneB, p, m, 1, 1},
          pp::ScheduleSpec{pp::ScheduleKind::Interleaved, p, m, 2, 1},
          pp::ScheduleSpec{pp::ScheduleKind::GPipe, p, m, 1, 1},
          pp::ScheduleSpec{pp::ScheduleKind::KFKB, p, m, 1, 2},
          pp::ScheduleSpec{pp::ScheduleKind::ZBH1, p, m, 1, 1},
          pp::ScheduleSpec{pp::ScheduleKind::ZBV, p, m, 2, 1}}) {
      if (spec.kind == pp::ScheduleKind::Interleaved && p < 2) continue;
      SCOPED_TRACE(fmt::format("{} {}", pp::schedule_name(spec.kind),
                               posting == pp::Posting::Rounds ? "in rounds" : "one pass ahead"));
      const int v = spec.virtual_stages, vstages = p * v;
      AddStage toy(stage, spec.placement());
      pp::Pipeline pipeline(toy, *group, spec, 64, posting);
      auto fetch = [](int micro, std::vector<int32_t>& tokens, std::vector<int32_t>& targets) {
        tokens.assign(1, micro + 1);
        targets.assign(1, 0);
      };
      std::vector<int64_t> ready;
      const float dloss = 0.5f;
      const double loss = pipeline.train(0, fetch, dloss, [&](int64_t c) { ready.push_back(c); });
      // Micro-batch k enters as k + 1 and leaves as k + 1 + (1 + 2 + ... + vstages).
      double want = 0.0;
      for (int k = 0; k < m; ++k) want += k + 1 + vstages * (vstages + 1) / 2;
      const bool holds_loss = stage == spec.placement().stage_of(vstages - 1);
      EXPECT_DOUBLE_EQ(loss, holds_loss ? want : 0.0);
      EXPECT_EQ(ready.size(), size_t(v)) << "one ready call per chunk, after its last backward";
      if (stage == 0) {
        ASSERT_EQ(toy.first_grads.size(), size_t(m));
        for (float g : toy.first_grads) EXPECT_FLOAT_EQ(g, dloss / kN * float(1 << vstages));
      }
      // The slots made are the micro-batches the schedule kept in flight at once.
      for (int c = 0; c < v; ++c) EXPECT_EQ(toy.slots(c), pipeline.peak_in_flight().at(size_t(c)));
      EXPECT_DOUBLE_EQ(pipeline.evaluate(m, fetch), holds_loss ? want : 0.0);
    }
}
