#pragma once
// AdamW with decoupled weight decay (none on norms and biases: ParamSpec::weight_decay),
// global-norm gradient clipping, and the learning-rate schedule.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/params.h"
#include "core/tensor.h"
#include "optim/config.h"
#include "optim/nvme_state.h"

namespace pentad {

class HostOffload;
class StagedUpload;
struct HostChunk;

// Learning rate of step s (0-based): linear warmup to cfg.lr, then cosine or linear
// decay to cfg.lr * min_lr_ratio at total_steps, or constant.
float learning_rate(const OptimConfig& cfg, int64_t step, int64_t total_steps);

// Sums of squares of this rank's gradients (pipeline copies left out), split into parameters
// sharded over tensor parallelism (to be summed over tp) and replicated ones (the same on every tp
// rank).
// MoE experts' parameters apart (to be summed over the ranks holding other experts or other
// etp shards, parallel::Mesh::expert_model); an expert's parameter replicated over etp (the
// GPT-2 experts' output bias) counts only where count_etp_replicated.
// With ZeRO, over this rank's shares only (shard), read from its compact reduced gradients
// (grads, shard.numel elements; empty: the gradient arena): then summed over dp as well.
struct GradSquares {
  double sharded = 0.0, replicated = 0.0, expert = 0.0;
};
GradSquares grad_sum_squares(const ParamStore& params, bool count_etp_replicated = true,
                             const StateShard* shard = nullptr, const Tensor& grads = {});
// The same three sums added into `sums`, three F64 (sharded, replicated, expert) on the
// gradients' device, with no readback (kernels::sum_squares_into): on CUDA nothing waits
// and the caller reads them back with the rest of the step. Each gradient's square sum is
// added on its own, where grad_sum_squares adds a parameter's pieces first: equal but for
// rounding.
void grad_sum_squares_into(const Tensor& sums, const ParamStore& params,
                           bool count_etp_replicated = true, const StateShard* shard = nullptr,
                           const Tensor& grads = {});

// Scales gradients (the arena's, or the compact ZeRO shares given) so that their global norm
// is at most max_norm (torch's clip_grad_norm_ rule: coefficient max_norm / (norm + 1e-6),
// applied when below 1).
void clip_gradients(ParamStore& params, double norm, float max_norm, const Tensor& grads = {});
// That coefficient as applied (1: none), for gradients clipped elsewhere (AdamW on the host).
float clip_coefficient(double norm, float max_norm);

class AdamW {
 public:
  // Called before each chunk of a step with the chunk's element range [begin, end) of the
  // parameter arena and where it starts in m and v (the same offset without ZeRO): nothing
  // in it has been written yet. A checkpoint copy in flight uses it to hold the update back
  // only where the copy has not reached (the optimizer itself knows nothing of checkpoints).
  using BeforeChunk = std::function<void(size_t begin, size_t end, size_t state_begin)>;
  // Chunks lie inside one parameter, in arena order, of at most this many elements. The
  // update is elementwise, so the bits do not depend on the chunking.
  static constexpr size_t kChunkElements = size_t{1} << 20;

  // shard: the part of the parameter arena this rank updates and keeps m and v for (ZeRO;
  // whole without it); m and v hold shard.numel elements, laid out as it says.
  // nvme (parallel.offload = "nvme"): m and v live in the file nvme->dir/file_name instead
  // of in memory, and step() streams them through host buffers sub-group by sub-group
  // (optim/nvme_state.h), bitwise the same update.
  // offload_params (with nvme; ZeRO-3, ZeRO-Infinity's parameter offload): the shard's
  // master parameters live in the file too, a third tensor beside m and v, and step()
  // updates them there; the parameter arena need not back the shard at all (the values go
  // to the file through store_params() or write_state()). With on_host too, step()
  // downloads only the gradients and updates the file's values on the host.
  // on_host (device parameters, parallel.offload = "cpu" or "nvme"): step() streams the
  // shard's parameters and gradients through the host's AdamW and back (optim/host_offload.h),
  // bitwise the update the CPU computes; m and v live in host memory, or with nvme in the file
  // (each sub-group's chunks streamed while the sub-group is in its buffers).
  AdamW(const OptimConfig& cfg, const ParamStore& params, StateShard shard = {},
        const NvmeOptions* nvme = nullptr, const std::string& file_name = "",
        bool offload_params = false, bool on_host = false);
  ~AdamW();
  bool offloaded() const { return nvme_ != nullptr; }
  bool params_offloaded() const { return params_offloaded_; }
  // Whether step() updates on the host from parameters streamed down from their device
  // (with offloaded(): moments on NVMe, otherwise in host memory).
  bool on_host() const { return host_ != nullptr; }
  // Where m and v live (m_base(), v_base()): the parameters' device, or the host when on_host
  // (none at all when offloaded()).
  Device state_device() const { return m_.device(); }
  // on_host: the page-locked staging (0 otherwise), with the parameter uploads' slots.
  size_t host_staging_bytes() const;
  // on_host: the shard's reduced gradients [state, state + count) (grads: the layout step()
  // reads, on the parameters' device) are final and come down now, during backward
  // (reserve_early_grads() first); forgotten at each step's start; the chunks of the step
  // that used them (HostOffload's early gradients). The step's clipping coefficient is
  // applied on the host (scale_grads_on_host), never to the device's copy.
  void reserve_early_grads();
  void download_early_grads(const float* grads, int64_t state, int64_t count);
  void scale_grads_on_host(float coefficient);
  void forget_early_grads();
  size_t early_grad_chunks() const;
  size_t host_chunks() const;
  const NvmeState* nvme() const { return nvme_.get(); }
  // Offloaded tensor 0 (m), 1 (v) or kParamTensor, elements [begin, begin + count) of the
  // shard, to or from host memory (resume, tests).
  static constexpr int kParamTensor = 2;
  void read_state(int tensor, int64_t begin, int64_t count, float* out);
  void write_state(int tensor, int64_t begin, int64_t count, const float* in);
  // Every sub-group of the offloaded state, once, through the streaming buffers: scan_state
  // only reads it (a checkpoint snapshot), rewrite_state writes back what fn leaves (an
  // in-job restore). fn sees state[t] = tensor t's shard elements [begin, end).
  void scan_state(const NvmeState::UpdateFn& fn) { nvme_->scan(fn); }
  void rewrite_state(const NvmeState::UpdateFn& fn) { nvme_->update(fn); }
  // Parameters offloaded: the shard's values go to the file, each parameter's from
  // values(id, out), which writes its local values (a whole parameter) to host memory (at
  // start-up: the initial draw, ParamStore::draw); parameters holding none of the shard are
  // not asked for. The shard's elements [begin, begin + count) come back from the file in
  // the background (start_param_read) to `into`, in the parameters' memory
  // (finish_param_read). On a device finish_param_read waits for the file read only: the
  // elements land in page-locked staging (reserve_param_uploads: 3 slots of the largest
  // read) and their copy to `into` is queued on the compute stream, ahead of whatever the
  // caller issues next (the all-gather).
  using ParamValues = std::function<void(int id, float* out)>;
  void store_params(const ParamStore& params, const ParamValues& values);
  void reserve_param_uploads(int64_t largest_read);
  uint64_t start_param_read(int64_t begin, int64_t count);
  void finish_param_read(uint64_t read, float* into);
  // Updates the master parameters of the shard (on their device) from grads (the compact
  // reduced gradients of the shard; empty: the gradient arena). The caller refreshes the
  // compute copy (kernels::refresh_weights), after ZeRO's all-gather.
  // out_of_place: reads the live parameters and moments and writes the new values into
  // the spare sets (allocate_spare(), and the parameters' own), which then become the live
  // ones; the previous state stays untouched in the spare sets until the next step out of
  // place (a checkpoint snapshot reads it there). Bitwise the same values as in place.
  void step(ParamStore& params, float lr, const BeforeChunk& before_chunk = {},
            bool out_of_place = false, const Tensor& grads = {});
  const StateShard& shard() const { return shard_; }
  void allocate_spare();  // second moments set, allocated and written now
  bool has_spare() const { return spare_m_.base() != nullptr; }
  // Swaps the live moments with the spare ones (with ParamStore::swap_params(): back to the
  // state before the last step out of place).
  void swap_state();
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t steps) { step_ = steps; }  // when resuming
  void reset();                                           // zero moments, step 0
  size_t state_bytes() const {  // in memory (offloaded: the streaming buffers)
    return m_.capacity() + v_.capacity() + spare_m_.capacity() + spare_v_.capacity() +
           (nvme_ ? nvme_->host_buffer_bytes() : 0);
  }
  void* m_base() const { return m_.base(); }
  void* v_base() const { return v_.base(); }

 private:
  OptimConfig cfg_;
  StateShard shard_;
  Arena m_, v_;              // first and second moments, laid out like the parameter arena
  Arena spare_m_, spare_v_;  // the spare set, when allocate_spare() made it
  int64_t step_ = 0;
  // Offloaded: the file, and the shard's pieces in shard order, for streaming.
  struct Segment {
    int64_t shard = 0, arena = 0, count = 0;
    float weight_decay = 0;
  };
  std::unique_ptr<NvmeState> nvme_;
  bool params_offloaded_ = false;
  Device params_device_ = Device::CPU;
  std::unique_ptr<StagedUpload> param_uploads_;  // offloaded device parameters' way back
  std::vector<Segment> segments_;
  void step_offloaded(ParamStore& params, float lr, const Tensor& grads);
  std::unique_ptr<HostOffload> host_;  // on_host: the staging and copy streams
  void step_on_host(ParamStore& params, float lr, const BeforeChunk& before_chunk,
                    const Tensor& grads);
  void step_nvme_on_host(ParamStore& params, float lr, const Tensor& grads);
  // The host's AdamW on one chunk: p and g in staging, m and v where the chunk's moments are.
  void update_chunk(const ParamStore& params, const HostChunk& c, float* p, const float* g,
                    float* m, float* v, float lr) const;
};

}  // namespace pentad
