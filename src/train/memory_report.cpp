// The memory plan the Trainer prints before training (Trainer::memory_plan): this rank's
// parameters, gradients, optimizer state, activations, MoE dispatch buffers and checkpoint
// snapshot, as its arenas, reducers and optimizer hold them, with what ZeRO and offloading do
// to each.
#include <algorithm>

#include "plan/memory_budget.h"
#include "train/trainer.h"

namespace pentad {

size_t Trainer::planned_param_bytes() const {
  const ParamStore& p = model_->params();
  if (zero_stage() != 3) return p.bytes() + p.compute_copy_bytes();
  // ZeRO-3: resident are this rank's shares (what the sparse arena backs) and the units whole
  // at once, each in a buffer of its own: the stretch computing and the next one prefetched,
  // per reducer (with MoE a layer's dense unit and its experts' are whole together), counted
  // by a dry run of the hooks through one forward and backward. With the shares on NVMe the
  // arena backs none of them, and each reducer's next share is being read ahead.
  const GatheredPeak gathered = zero3_gathered_peak(zero_reducers(), p, model_->stretches(),
                                                    int(cfg_.parallel.zero_live_units));
  size_t read_ahead = 0;
  for (const parallel::GradReducer* r : zero_reducers()) {
    int64_t most = 0;
    for (int b = 0; b < r->buckets_count(); ++b) most = std::max(most, r->bucket_share(b));
    read_ahead += size_t(most) * sizeof(float);
  }
  // A gathered unit's values, and its compute copy when the model computes in bf16.
  const size_t per_value =
      sizeof(float) + (p.compute_dtype() == DType::F32 ? 0 : dtype_bytes(p.compute_dtype()));
  return size_t(gathered.whole) * per_value + (optimizer_->params_offloaded() ? read_ahead : 0) +
         p.committed_param_bytes();
}

size_t Trainer::planned_grad_bytes(size_t shard) const {
  const ParamStore& p = model_->params();
  // Stages 2 and 3 also hold up to GradReducer::kInFlight buckets of the full gradients (per
  // reducer: the experts' too) while their reductions are pending (README's "2 buckets").
  size_t pending = 0;
  if (zero_stage() >= 2)
    for (const parallel::GradReducer* r : {reducer_.get(), expert_reducer_.get()})
      if (r)
        pending += parallel::GradReducer::kInFlight * size_t(r->largest_bucket()) * sizeof(float);
  return zero_stage() == 0   ? p.bytes()
         : zero_stage() == 1 ? p.bytes() + shard
                             : std::min(p.bytes(), pending) + shard;
}

std::string Trainer::sharding_note(size_t shard) const {
  const ParamStore& p = model_->params();
  const NvmeState* nvme = optimizer_->nvme();
  const bool nvme_params = optimizer_->params_offloaded();
  std::string text;
  if (zero_stage() > 0)
    text = fmt::format(
        " | ZeRO-{} over dp x cp = {}{}: this rank's shares {} of {} values (AdamW m, v and the "
        "reduced gradients){}",
        zero_stage(), dp_size_ * cp_size_,
        expert_reducer_
            ? fmt::format(", the routed experts over edp = {}", mesh_->degree(parallel::Axis::EDP))
            : "",
        optimizer_->shard().numel, p.numel(),
        zero_stage() >= 2 ? "; the full gradients live only bucket by bucket during backward" : "");
  if (optimizer_->on_host() && !nvme)
    text += fmt::format(
        " | AdamW state in host memory: {} (m and v) and {} of page-locked staging; each step "
        "streams the {} values' parameters and gradients through the host and back",
        format_bytes(2 * shard), format_bytes(optimizer_->host_staging_bytes()),
        optimizer_->shard().numel);
  if (zero_stage() == 3 && !nvme_params)
    text += fmt::format(
        "; parameters: the {} of this rank's shares stay, each layer is gathered into a buffer "
        "of its own while it computes and dropped after",
        format_bytes(shard));
  if (nvme_params)
    text += fmt::format(
        "; parameters: none resident, the {} of this rank's shares live on NVMe, each layer's "
        "is read back{} and the layer gathered while the one before computes, all dropped after",
        format_bytes(shard),
        p.device() == Device::CUDA ? " through page-locked staging, uploaded," : "");
  if (nvme)
    text += fmt::format(
        " | AdamW state on NVMe{}: {} in {}{} (in {}memory: 3 sub-groups of {}, {}{})",
        nvme_params ? " with the parameter shares" : "", format_bytes(nvme->file_bytes()),
        nvme->path(), nvme->direct() ? ", direct I/O" : "", optimizer_->on_host() ? "host " : "",
        nvme_params ? "p, m and v" : "m and v", format_bytes(nvme->host_buffer_bytes()),
        optimizer_->on_host()
            ? fmt::format(", and {} of page-locked staging; each step streams the {} values' "
                          "{}",
                          format_bytes(optimizer_->host_staging_bytes()), optimizer_->shard().numel,
                          nvme_params ? "gradients to the host, where their parameters are "
                                        "updated in the file"
                                      : "parameters and gradients through the host and back")
            : "");
  return text;
}

size_t Trainer::planned_activation_bytes(std::string& note) const {
  size_t acts = model_->activation_bytes() + model_->cp().scratch_bytes();
  if (cp_size_ > 1)
    note = fmt::format(
        "; {} tokens of each sequence here (cp {} {}), with {} of "
        "context-parallel buffers",
        cfg_.train.seq_len / cp_size_, cp_size_, cfg_.parallel.cp_impl,
        format_bytes(model_->cp().scratch_bytes()));
  if (!pipeline_) return acts;
  // One slot per micro-batch the schedule keeps in flight on each chunk.
  const parallel::pp::ScheduleSpec& spec = pipeline_->schedule();
  const std::vector<parallel::pp::Action> actions = parallel::pp::stage_actions(spec, pp_rank_);
  for (int c = 0; c < model_->chunks(); ++c) {
    const int peak = parallel::pp::peak_in_flight(actions, c);
    acts += size_t(peak - model_->slots_made(c)) * model_->slot_bytes(c);
    note += fmt::format("{}chunk {} (layers {}-{}): {} micro-batches in flight x {}",
                        c ? ", " : "; ", c, model_->chunk(c).layer_begin,
                        model_->chunk(c).layer_end - 1, peak, format_bytes(model_->slot_bytes(c)));
  }
  return acts;
}

size_t Trainer::planned_dispatch_bytes(std::string& experts, std::string& note) const {
  // MoE: the routed experts held here, and the dispatch buffers, which are sized at each
  // forward by the routing (counted here at the estimate's worst case).
  if (!cfg_.model.is_moe()) return 0;
  int64_t expert_values = 0;
  for (const ParamSpec& spec : model_->params().specs())
    if (spec.expert) expert_values += spec.local_shape.numel();
  experts = fmt::format(", {} in routed experts", expert_values);
  const size_t dispatch = size_t(
      estimate_memory(cfg_, mesh_ ? mesh_->config() : parallel::MeshConfig{}, pp_rank_).dispatch);
  note = fmt::format(" | MoE dispatch buffers up to {} (worst case, sized as routed)",
                     format_bytes(dispatch));
  return dispatch;
}

std::string Trainer::memory_plan() const {
  const ParamStore& p = model_->params();
  // ZeRO: AdamW keeps m and v for this rank's shares (S elements of the arena's N); stage 1
  // adds the reduced shares (S) to the full gradients (N), stage 2 holds the full gradients
  // only bucket by bucket while backward writes them (a bucket's pages go once reduced),
  // plus the reduced shares (S; later micro-batches add them into each bucket before its
  // reduce-scatter writes them back).
  const size_t shard = size_t(optimizer_->shard().numel) * sizeof(float);
  const size_t params = planned_param_bytes();
  const size_t grads = planned_grad_bytes(shard);
  // Updated on the host (CUDA, offload "cpu" or "nvme"): none on the device (counted in the
  // text below). Offloaded to NVMe: the streaming buffers (three sub-groups of m and v).
  const NvmeState* nvme = optimizer_->nvme();
  const size_t optim = optimizer_->on_host() ? 0 : nvme ? nvme->host_buffer_bytes() : 2 * shard;
  // The second set of parameters and moments (swap), or the staging buffer (copy).
  const size_t snapshot = p.has_spare() ? p.bytes() + 2 * shard : checkpoints_->staging_bytes();
  // The in-memory level's two slots: host memory (a tmpfs), allocated once the run resumed.
  const size_t memory_level = checkpoints_->memory_level_bytes();
  std::string in_flight, experts, dispatch_text;
  const size_t acts = planned_activation_bytes(in_flight);
  const size_t dispatch = planned_dispatch_bytes(experts, dispatch_text);
  return fmt::format(
      "memory plan (this rank, {} {}): parameters {} ({} values{}{}) | gradients {} | AdamW state "
      "{} | activations {} (micro-batch {} x {}, recompute {}{}){}{}{}{} | total {}",
      cfg_.train.device, cfg_.train.precision, format_bytes(params), p.numel(),
      p.compute_copy_bytes() ? ", f32 master + bf16 copy" : "", experts, format_bytes(grads),
      format_bytes(optim), format_bytes(acts), cfg_.train.micro_batch, cfg_.train.seq_len,
      cfg_.model.recompute ? "on" : "off", in_flight, dispatch_text, sharding_note(shard),
      snapshot ? fmt::format(" | checkpoint snapshot {} ({})", format_bytes(snapshot),
                             p.has_spare() ? "swap: a second set of the state" : "copy: staging")
               : "",
      memory_level ? fmt::format(" | in-memory checkpoints {} (two snapshots in {})",
                                 format_bytes(memory_level), cfg_.checkpoint.memory_dir)
                   : "",
      format_bytes(params + grads + optim + acts + dispatch + snapshot + memory_level));
}

}  // namespace pentad
