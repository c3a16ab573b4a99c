#pragma once
// The Trainer's checkpoints, handed to a class of their own (as torchtitan's Trainer hands
// them to its CheckpointManager): which state a snapshot holds, saving it (lazy and
// asynchronous, or a swap of state sets), committing it in each level, restoring the newest
// from host memory, and loading a checkpoint of any layout to resume or to initialize.
// checkpoint_manager.cpp: the snapshot's contents, save, the optimizer step's side, the
// commit and its reports; checkpoint_load.cpp: resume, init_from, the roots' checks;
// checkpoint_snapshot.cpp: the restore from host memory; checkpoint_nvme.cpp: the part of a
// snapshot that lives in the optimizer's NVMe file; checkpoint_commit.h: each level's commit.
// The format and the background saver live in checkpoint/.
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/memory_level.h"
#include "checkpoint/saver.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "parallel/mesh.h"
#include "recipe/config.h"
#include "train/checkpoint_commit.h"
#include "train/grad_sync.h"

namespace pentad {

// The run's tokenizer as it was when the run started (Trainer::keep_tokenizer(), rank 0):
// every checkpoint carries these bytes, whatever later happens to the file. No file: none.
struct KeptTokenizer {
  std::string file, sha256;  // Manifest::tokenizer_file, tokenizer_sha256
  std::shared_ptr<const std::string> bytes;
};

class CheckpointManager {
 public:
  // What the manager reads of the training run, and the little it asks of it. Every
  // reference is the Trainer's, built before the manager and outliving it.
  struct Run {
    const Config& cfg;
    parallel::Mesh* mesh = nullptr;  // null on one rank
    Model& model;
    AdamW& optimizer;
    GradSync& grad_sync;   // the ZeRO stage in effect; ZeRO-3's units, released by a restore
    int embedding_id = 0;  // the tied embedding's parameter on this stage
    const KeptTokenizer& tokenizer;  // filled as the run starts
    // The training order's index of step `step`'s first sample (Trainer::first_sample).
    std::function<int64_t(int64_t step)> first_sample;
    // After a resume's load from dir: the data order continues where its manifest says.
    std::function<void(const ckpt::Manifest&, const std::string& dir)> continue_data_order;
    // Parameters on NVMe: every share read ahead landed, before the optimizer's file is
    // streamed or rewritten, and every gathered unit released.
    std::function<void()> settle_offloaded_shares;
    std::function<void(const nlohmann::json&)> write_metrics;  // a row of metrics.jsonl
  };
  // At start-up, when the run saves (train.save_every > 0): the spare state sets (swap) or
  // the staging buffer (copy) are allocated and touched now rather than inside the first save.
  explicit CheckpointManager(Run run);
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // The levels a run saves to: train.ckpt_dir (default <out_dir>/checkpoints), then the
  // mirror (train.ckpt_mirror) where there is one.
  static std::string root(const TrainConfig& train);
  static std::vector<std::string> roots(const TrainConfig& train);

  // save() starts a snapshot of the state after `steps_done` steps (lazy and asynchronous
  // when train.async_save); commit_pending() makes the newest snapshot a committed
  // checkpoint once every rank has written its file (block: wait for that and for the
  // commit), in each level on its own. Rank 0 commits on a thread of its own (manifest,
  // renames, fsyncs); without block, the next commit_pending() takes the outcome. A level
  // that failed train.max_failed_saves saves in a row makes it throw SavesFailed, unless its
  // newest committed checkpoint still stands and its first failure in the row was under
  // train.failed_save_grace_s ago (the snapshot in memory is the newest state meanwhile).
  // Collective: every rank calls them at the same points.
  void save(int64_t steps_done);
  void commit_pending(bool block);
  // The in-memory level (checkpoint.memory_every): whether a snapshot is due after
  // `steps_done` steps (a step that saves a file takes none), and taking it: a lazy copy
  // into host memory that outlives the process, which the optimizer follows as it follows a
  // save's. A failed snapshot is a warning; the level goes on. Collective only in timing.
  bool memory_due(int64_t steps_done) const;
  void save_to_memory(int64_t steps_done);
  // The end of a run: the last snapshot committed, the checkpoint summary (the blocked time
  // while training and the final flush apart), <ckpt_dir>/recycled
  // (checkpoint.recycle_files) removed. Collective.
  void finish_run();

  // Loads a checkpoint (any layout) into this rank's shards; returns the step to resume
  // at. "latest" tries the newest committed checkpoint and falls back past corrupt ones;
  // it starts from step 0 only where there is none. Refuses (throws, loading and writing
  // nothing) a checkpoint of another model, and checkpoints none of which loads.
  int64_t resume(const std::string& which);
  // train.init_from: the weights of a checkpoint (or of a root's newest loadable one),
  // optimizer fresh, step 0. Refuses a checkpoint of another model.
  void init_from(const std::string& path);
  // Before the first save: refuses checkpoint roots that hold checkpoints this run did not
  // resume, or (after a resume at resumed_step) checkpoints newer than that step, which its
  // saves would write over. Newer ones are moved aside instead, never deleted: to
  // <root>/retired/ with train.retire_newer, to <root>/unloadable/ when --resume latest fell
  // back past them. Collective.
  void check_roots(int64_t resumed_step);

  // The in-memory level's snapshot files of this rank (its prefix, checkpoint/memory_level.h).
  const std::string& memory_prefix() const { return memory_.prefix(); }

  // Restarts inside the job from the newest snapshot (the last save()), which stays in
  // host memory: parameters, AdamW moments and step, bitwise what resume() would load from
  // its checkpoint, without reading disk. Returns the step to train next, or -1 when this
  // job has saved nothing. Collective. With copy snapshots, ranks that hold no staged copy
  // (data-parallel replicas; tensor-parallel ranks for replicated parameters) receive it by
  // broadcast; with swap snapshots every rank still holds its own set and swaps back to it.
  int64_t restore_snapshot();

  // The optimizer step's side (Trainer::optimizer_step), in this order. before_update():
  // what AdamW::step waits for before each chunk it updates, until a snapshot copy in flight
  // holds that chunk's parameters and moments (offloaded: the whole copy first; empty when
  // no copy is in flight). update_out_of_place(): right after a swap snapshot, whose set
  // stays frozen. updated(): after the update. before_params_written(): with ZeRO, before
  // the all-gather writes every parameter, which a copy in flight must hold first.
  AdamW::BeforeChunk before_update();
  bool update_out_of_place() const { return swap_pending_; }
  void updated();
  void before_params_written();

  // The survivors' state (ckpt::write_survivor, train/survivor_save.h). The optimizer step
  // holds writing_state() while it writes parameters and moments, and before letting go says
  // which step they now are at (live_step). write_survivor_state(), on SurvivorSave's thread:
  // this rank's whole state (its replicas' copies too) into the first checkpoint level's
  // survivors' directory for this job (`tag`, the same on every rank); nothing when the
  // optimizer does not let go within half a second (a rank that died in the middle of its
  // collectives leaves them half written), when the state is on a device or on NVMe (not
  // read from this thread), or before the first step. Says what it did in one line.
  std::unique_lock<std::mutex> writing_state() {
    return std::unique_lock<std::mutex>(state_mutex_);
  }
  void live_step(int64_t step);
  void write_survivor_state(const std::string& tag);
  // Whether write_survivor_state() can write at all (host state, no NVMe, saves on).
  bool survivors_possible() const;
  // Before write_survivor_state(): the whole state's count of tensors (collective).
  void count_survivor_tensors();

  // Whether this rank's copy of a parameter goes to the checkpoint (the first replica of
  // each shard writes it; the weight dumps follow the same rule).
  bool writes(const ParamSpec& spec) const;
  // The training thread's seconds spent on checkpoints: the saver's waits, and the commits
  // (the collective that asks whether every file is done, manifest, renames, fsyncs).
  double blocked_seconds() const {
    return saver_.blocked_seconds() + memory_.blocked_seconds() + committer_->seconds();
  }
  // The copy snapshot's staging buffer, and the in-memory level's two (the memory plan).
  size_t staging_bytes() const { return saver_.staging_bytes(); }
  size_t memory_level_bytes() const;

 private:
  bool logs() const { return world_rank_ == 0; }
  int zero_stage() const { return grad_sync_.zero_stage(); }
  // The state a checkpoint holds, each buffer laid out like the parameter arena.
  struct StateBuffer {
    const char* prefix;  // tensor name prefix in the checkpoint: "param/", "adam_m/", "adam_v/"
    void* base;
  };
  std::vector<StateBuffer> state_buffers(bool with_optimizer) const;
  // What this rank holds of parameter id's state: its value (whole), and its m and v, whole
  // or (ZeRO) the rows of this rank's share; each with the checkpoint's name for it.
  struct StatePart {
    ckpt::ShardInfo info;  // name, global identity, rows (row_start, local_shape)
    Tensor view;           // the live elements (offloaded moments: none, they are on disk)
    bool moment = false;   // m or v
    int tensor = 0;        // the optimizer's tensor: 0 for m, 1 for v, kParamTensor (ZeRO-3)
    int64_t shard = 0;     // shares: where they start in the optimizer's shard
    bool on_nvme = false;  // in the optimizer's file, not at `view` (parallel.offload = "nvme")
  };
  std::vector<StatePart> state_parts(int id, bool with_optimizer) const;
  // A snapshot tensor that lives in the optimizer's NVMe file: its index in the snapshot,
  // the optimizer's tensor, and where its elements are in the shard.
  struct NvmeSlice {
    size_t index = 0;
    int tensor = 0;
    int64_t shard = 0, count = 0;
  };
  // What this rank's snapshot holds (empty on data-parallel replicas), in the optimizer's
  // order: each parameter's value, m, v. Offloaded ones (from_caller) listed in `on_nvme`.
  std::vector<ckpt::LiveTensor> snapshot_tensors(std::vector<NvmeSlice>* on_nvme = nullptr) const;
  // For the optimizer: before each chunk it updates, waits only until a snapshot copy in
  // flight holds that chunk's parameters and moments (empty when no copy is in flight).
  AdamW::BeforeChunk snapshot_copied();
  // checkpoint_nvme.cpp: the offloaded part of a snapshot, from the file into staging at
  // save() (one pass over the file) and back at restore_snapshot().
  void stage_from_nvme(const std::vector<float*>& staged);
  void unstage_to_nvme(const std::vector<float*>& staged);
  bool snapshot_covers_nvme() const;  // whether this rank's snapshot holds its whole file
  void prepare_nvme_restore();        // refuses unless it does on every rank (collective)
  int64_t restored_snapshot();        // restore_snapshot()'s common end: step, schedule, message
  // After the ranks that staged a snapshot copied it back: the replicas that did not stage
  // it (data- and context-parallel ones, tp ranks' replicated parameters, the tied
  // embedding's last-stage copy) receive it from those that did. Collective.
  void share_restored_state();
  // --resume latest: the newest in-memory snapshot every rank holds, of this layout and
  // model, where it is newer than step `newer_than` (the newest checkpoint file), loaded.
  std::optional<int64_t> resume_from_memory(int64_t newer_than);
  // The newest step at or below `bound` (< 0: any) that every rank's `held` has; -1: none.
  // Collective.
  int64_t common_memory_step(const std::vector<ckpt::MemoryLevel::Held>& held, int64_t bound);
  // check_roots()'s part for the in-memory level: newer snapshots this run did not take are
  // refused or set aside as the files' are; then the level's slots are allocated (where
  // that fails, the level is off for the run, with a warning).
  void check_memory_level(int64_t resumed_step, bool searched);
  // The step loaded, or none (and a warning) if the checkpoint is unusable (corrupt,
  // truncated, missing). with_optimizer = false loads the parameters only and starts the
  // optimizer afresh.
  std::optional<int64_t> load(const std::string& dir, bool with_optimizer);
  // Throws unless the checkpoint at dir holds this recipe's model (`action`: what was
  // refused, for the message); logs the other keys that changed when `log_changes`.
  void check_same_model(const std::string& dir, const std::string& action, bool log_changes) const;
  // What rank 0's commit of the checkpoint of `step` records.
  CheckpointCommitter::Record checkpoint_record(int64_t step) const;
  // The checkpoint summary at the end of a run, and each save's saver timings (metrics.jsonl).
  void report(double blocked_seconds, double final_flush_seconds);
  void report_saver_time(int64_t step, const ckpt::AsyncSaver::Timings& timings);
  int all_ranks(int value, parallel::ReduceOp op);  // over the world; value alone on one rank
  int64_t all_ranks64(int64_t value, parallel::ReduceOp op);  // the same, for steps

  const Config& cfg_;
  parallel::Mesh* const mesh_;
  Model& model_;
  AdamW& optimizer_;
  GradSync& grad_sync_;
  const int embedding_id_;
  const KeptTokenizer& tokenizer_;
  const std::function<int64_t(int64_t)> first_sample_;
  const std::function<void(const ckpt::Manifest&, const std::string&)> continue_data_order_;
  const std::function<void()> settle_offloaded_shares_;
  const std::function<void(const nlohmann::json&)> write_metrics_;
  int world_rank_ = 0;
  int dp_size_ = 1, dp_rank_ = 0;
  int cp_size_ = 1, cp_rank_ = 0;
  ckpt::AsyncSaver saver_;
  std::unique_ptr<CheckpointCommitter> committer_;             // commits what saver_ wrote
  int64_t pending_optimizer_steps_ = 0;                        // of the snapshot not yet committed
  int64_t snapshot_step_ = -1, snapshot_optimizer_steps_ = 0;  // of the newest, in memory
  std::vector<NvmeSlice> snapshot_on_nvme_;                    // of the newest snapshot
  // Swap snapshots (checkpoint.snapshot = "swap"): the newest snapshot is the live state set
  // until the next optimizer step (swap_pending_: that step goes out of place), then the
  // spare one (snapshot_in_spare_).
  bool swap_snapshots_ = false, swap_pending_ = false, snapshot_in_spare_ = false;
  int64_t saves_ = 0;
  ckpt::MemoryLevel memory_;  // checkpoint.memory_every; its snapshots of any earlier process
  int64_t memory_snapshots_ = 0;
  bool resumed_from_memory_ = false;
  bool memory_off_ = false;  // its slots could not be allocated (a warning said why)
  std::mutex state_mutex_;   // writing_state()
  int64_t live_step_ = -1, live_optimizer_steps_ = 0;
  int64_t survivor_tensors_ = -1;
};

}  // namespace pentad
