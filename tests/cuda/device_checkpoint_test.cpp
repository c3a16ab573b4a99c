// Checkpoints of device-resident state (train.device = "cuda"): the saver copies CUDA
// memory into its host staging behind the kernels already issued and ahead of an optimizer
// that overwrites the state chunk by chunk; restore() writes device memory back; and a
// trainer on the GPU restores its in-memory snapshot bitwise as it resumes the same step
// from disk (fp32 and bf16, whose compute copy must follow the restored master weights; and
// fp32 with AdamW's moments on NVMe, staged through the host).
//
// Without a CUDA device every test skips with "no CUDA device" (ctest reports it skipped).
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/saver.h"
#include "core/device_memory.h"
#include "launch/rank.h"
#include "recipe/recipe.h"
#include "train/trainer.h"

namespace pentad {
namespace {

namespace fs = std::filesystem;

bool have_device() {
  return cuda_device_count() > 0;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

fs::path temp_dir(const std::string& what) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return fs::temp_directory_path() / fmt::format("pentad-{}-{}-{}", what, ::getpid(), info->name());
}

// Host values and their device copies; sizes that are not whole pages or pieces.
struct DeviceState {
  std::vector<std::vector<float>> host;
  std::vector<float*> device;

  explicit DeviceState(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    for (size_t n :
         {size_t{3}, size_t{5'000'001}, size_t{1023}, size_t{4'000'000}, size_t{2'999'999}}) {
      host.emplace_back(n);
      for (float& x : host.back()) x = normal(rng);
      device.push_back(static_cast<float*>(device_alloc(n * sizeof(float), "test state")));
    }
  }
  ~DeviceState() {
    for (float* d : device) device_free(d);
  }
  DeviceState(const DeviceState&) = delete;
  DeviceState& operator=(const DeviceState&) = delete;

  void upload(const std::vector<std::vector<float>>& values) {
    for (size_t i = 0; i < device.size(); ++i)
      copy_bytes(device[i], Device::CUDA, values[i].data(), Device::CPU,
                 values[i].size() * sizeof(float));
  }
  std::vector<float> download(size_t i) const {
    std::vector<float> out(host[i].size());
    copy_bytes(out.data(), Device::CPU, device[i], Device::CUDA, out.size() * sizeof(float));
    return out;
  }
  std::vector<ckpt::LiveTensor> live() const {
    std::vector<ckpt::LiveTensor> out;
    for (size_t i = 0; i < device.size(); ++i) {
      const auto n = static_cast<int64_t>(host[i].size());
      out.push_back({ckpt::ShardInfo{"param/t" + std::to_string(i), Shape{n}, -1, 0, Shape{n}, 0},
                     device[i], Device::CUDA});
    }
    return out;
  }
};

TEST(DeviceCheckpoint, SaverCopiesDeviceStateBehindTheOptimizer) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const fs::path root = temp_dir("device-saver");
  fs::remove_all(root);
  DeviceState state(1);
  const DeviceState other(2);  // only its host values: what the "optimizer" writes
  state.upload(other.host);
  state.upload(state.host);  // issued before begin(): the snapshot must see it
  ckpt::AsyncSaver saver;
  const std::string file = ckpt::partial_dir(root.string(), 1) + "/" + ckpt::rank_file_name(0);
  saver.begin({file}, state.live(), true);
  // The optimizer's pattern: chunk by chunk, wait, then overwrite the device memory.
  constexpr size_t kChunk = 1'000'000;
  for (size_t i = 0; i < state.device.size(); ++i)
    for (size_t at = 0; at < state.host[i].size(); at += kChunk) {
      const size_t count = std::min(kChunk, state.host[i].size() - at);
      saver.wait_for_copy(state.device[i] + at, state.device[i] + at + count);
      copy_bytes(state.device[i] + at, Device::CUDA, other.host[i].data() + at, Device::CPU,
                 count * sizeof(float));
    }
  saver.wait_for_file();

  ckpt::Manifest m;
  m.step = 1;
  ckpt::remove_dirs(ckpt::commit(root.string(), m, 0));
  ckpt::Reader reader(ckpt::checkpoint_dir(root.string(), 1));
  for (size_t i = 0; i < state.host.size(); ++i) {
    const Shape shape{static_cast<int64_t>(state.host[i].size())};
    std::vector<float> got(state.host[i].size());
    reader.read("param/t" + std::to_string(i), shape, -1, 0, shape, got.data());
    EXPECT_TRUE(same_bits(got, state.host[i])) << "tensor " << i;
    EXPECT_EQ(reader.manifest().shards.at(i).shard.checksum,
              XXH3_64bits(state.host[i].data(), state.host[i].size() * sizeof(float)));
  }

  // restore() writes the snapshot back into device memory.
  for (size_t i = 0; i < state.device.size(); ++i)
    EXPECT_TRUE(same_bits(state.download(i), other.host[i])) << "tensor " << i;
  ASSERT_TRUE(saver.restore());
  for (size_t i = 0; i < state.device.size(); ++i)
    EXPECT_TRUE(same_bits(state.download(i), state.host[i])) << "tensor " << i;
  if (!::testing::Test::HasFailure()) fs::remove_all(root);
}

std::vector<float> params_of(Trainer& t) {
  const ParamStore& p = t.model().params();
  std::vector<float> all;
  for (int id = 0; id < static_cast<int>(p.specs().size()); ++id) {
    const std::vector<float> one = p.to_host(id);
    all.insert(all.end(), one.begin(), one.end());
  }
  return all;
}

// The precision, and whether AdamW's moments live on NVMe (parallel.offload = "nvme": the
// save reads them from the file into the snapshot's staging on the host, the restore writes
// them back to the file, the resume from disk writes them there through write_state).
struct SnapshotCase {
  const char* name;
  const char* precision;
  bool nvme;
};

void PrintTo(const SnapshotCase& c, std::ostream* os) {
  *os << c.name;
}

class DeviceSnapshot : public ::testing::TestWithParam<SnapshotCase> {};

TEST_P(DeviceSnapshot, RestoreFromMemoryEqualsResumeFromDisk) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const fs::path out = temp_dir(std::string("device-snapshot-") + GetParam().name);
  fs::remove_all(out);
  // llama-tiny's model, stated here: the bundle that runs this on a GPU machine carries no
  // recipe files at this machine's paths.
  std::vector<std::string> keys = {"model.family=llama",
                                   "model.n_layer=2",
                                   "model.d_model=64",
                                   "model.n_head=4",
                                   "model.n_kv_head=2",
                                   "model.vocab_size=512",
                                   "model.max_seq_len=64",
                                   "model.tie_embeddings=false",
                                   "optim.lr=3e-3",
                                   "optim.warmup_steps=10",
                                   "data.source=random",
                                   "train.steps=14",
                                   "train.micro_batch=2",
                                   "train.seq_len=32",
                                   "train.grad_accum=2",
                                   "train.eval_every=0",
                                   "train.device=cuda",
                                   std::string("train.precision=") + GetParam().precision,
                                   "train.out_dir=" + out.string()};
  if (GetParam().nvme) {  // sub-groups of 64 KiB: many, cut mid-parameter
    fs::create_directories(out / "nvme");
    keys.insert(keys.end(), {"parallel.offload=nvme",
                             "parallel.offload_path=\"" + (out / "nvme").string() + "\"",
                             "parallel.nvme_subgroup_kb=64", "parallel.nvme_block_kb=16"});
  }
  const Config cfg = parse_recipe("", "device_checkpoint_test", keys);
  constexpr int64_t kSaved = 8, kEnd = 12;
  std::vector<float> first, again, resumed, restored_params, final_params;
  launch::start_rank(cfg);  // threads and the GPU, as the executable sets them
  {
    Trainer trainer(cfg);
    for (int64_t s = 0; s < kSaved; ++s) trainer.train_step(s);
    trainer.save(kSaved);  // its copy overlaps the next step's kernels
    for (int64_t s = kSaved; s < kEnd; ++s) first.push_back(trainer.train_step(s).loss);
    trainer.commit_pending(true);
    ASSERT_EQ(trainer.restore_snapshot(), kSaved);
    restored_params = params_of(trainer);
    for (int64_t s = kSaved; s < kEnd; ++s) again.push_back(trainer.train_step(s).loss);
    final_params = params_of(trainer);
  }
  Trainer from_disk(cfg);
  ASSERT_EQ(from_disk.resume(ckpt::checkpoint_dir(from_disk.checkpoint_root(), kSaved)), kSaved);
  EXPECT_TRUE(same_bits(params_of(from_disk), restored_params));
  for (int64_t s = kSaved; s < kEnd; ++s) resumed.push_back(from_disk.train_step(s).loss);
  // Equal losses after restoring: moments, step count and (bf16) the compute copy came back.
  EXPECT_TRUE(same_bits(again, first));
  EXPECT_TRUE(same_bits(resumed, first));
  EXPECT_TRUE(same_bits(params_of(from_disk), final_params));
  if (!::testing::Test::HasFailure()) fs::remove_all(out);
}

// The in-memory level on a GPU: the copy off the device into a shared, page-locked slot on
// the saver's stream, then (the trainer gone, as a crashed process is) a new trainer's
// --resume latest takes the slot, bitwise the state and the steps that followed.
TEST(DeviceMemoryLevel, ANewProcessResumesFromTheSlotBitwise) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const fs::path out = temp_dir("device-memory-level");
  fs::remove_all(out);
  const Config cfg = parse_recipe(
      "", "device_checkpoint_test",
      {"model.family=llama", "model.n_layer=2", "model.d_model=64", "model.n_head=4",
       "model.n_kv_head=2", "model.vocab_size=512", "model.max_seq_len=64",
       "model.tie_embeddings=false", "data.source=random", "train.steps=14", "train.micro_batch=2",
       "train.seq_len=32", "train.eval_every=0", "train.device=cuda", "train.precision=bf16",
       "train.save_every=100", "checkpoint.memory_every=1",
       "checkpoint.memory_dir=" + (out / "shm").string(), "train.out_dir=" + out.string()});
  constexpr int64_t kTaken = 6, kEnd = 10;
  std::vector<float> first, resumed, taken_params;
  launch::start_rank(cfg);
  {
    Trainer trainer(cfg);
    for (int64_t s = 0; s < kTaken; ++s) trainer.train_step(s);
    taken_params = params_of(trainer);
    trainer.save_to_memory(kTaken);  // its copy overlaps the next step's kernels
    for (int64_t s = kTaken; s < kEnd; ++s) first.push_back(trainer.train_step(s).loss);
  }  // gone without finishing its run: the slot stays
  Trainer again(cfg);
  ASSERT_EQ(again.resume("latest"), kTaken);
  EXPECT_TRUE(same_bits(params_of(again), taken_params));
  for (int64_t s = kTaken; s < kEnd; ++s) resumed.push_back(again.train_step(s).loss);
  EXPECT_TRUE(same_bits(resumed, first));
  if (!::testing::Test::HasFailure()) fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Precisions, DeviceSnapshot,
                         ::testing::Values(SnapshotCase{"fp32", "fp32", false},
                                           SnapshotCase{"bf16", "bf16", false},
                                           SnapshotCase{"fp32_nvme", "fp32", true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace pentad
