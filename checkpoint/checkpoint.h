#pragma once
// Checkpoints on disk. A checkpoint is a directory <root>/step-<8 digits>/ holding one HDF5
// file per writing rank (rank-<5 digits>.h5) and manifest.json. Every dataset is one
// tensor shard that carries its global identity (name, global shape, the slice it holds),
// so any layout can read any other's checkpoint (resharding on load). While being
// written the directory is <root>/step-<N>.partial/; rank 0 renames it into place only
// after every rank's file is complete and the manifest is written, so a crash at any
// instant leaves the previous checkpoint the latest valid one.
//
// Tensor names: "param/<parameter name>", "adam_m/<name>", "adam_v/<name>".
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace pentad::ckpt {

struct ShardInfo {
  std::string name;  // e.g. "param/layers.0.attn.q.weight"
  Shape global_shape;
  int shard_dim = -1;       // -1: the whole tensor
  int64_t shard_start = 0;  // along shard_dim
  Shape local_shape;
  uint64_t checksum = 0;  // of the shard's bytes (little-endian f32), by the algorithm
                          // its manifest names (Manifest::checksum)
  int64_t row_start = 0;  // a ZeRO share: local_shape[0] rows of the slice from this row on
  int shard_dim2 = -1;    // a 2D tensor-parallel block: also cut along this dim
  int64_t shard_start2 = 0;
};

struct ShardData {
  ShardInfo info;
  const float* data = nullptr;  // page-aligned data is written with direct I/O
  bool checksummed = false;     // info.checksum already holds its xxh3-64 (the saver folds it
                                // into its copy); otherwise the writer computes it
};

struct Layout {
  int world = 1, tp = 1, dp = 1, pp = 1, cp = 1;
  bool sequence_parallel = false;
};

struct Manifest {
  int64_t step = 0;             // optimizer steps completed; training resumes at this step
  int64_t optimizer_steps = 0;  // AdamW's step counter (bias correction)
  // Training samples consumed: where the data order continues (global sample index).
  // -1: not recorded (older checkpoints, imported ones).
  int64_t samples = -1;
  Layout layout;            // of the run that wrote it
  std::string recipe_toml;  // the effective recipe
  // The tokenizer of the run's tokens, carried in the checkpoint directory (commit() writes
  // it): its file name there (kTokenizerFiles) and the sha256 of its bytes (sha256sum's
  // hex); both empty where the run names no tokenizer (random or pre-tokenized data without
  // data.tokenizer) and in checkpoints written before issue 45.
  std::string tokenizer_file, tokenizer_sha256;
  // Algorithm of every shard's checksum: "xxh3-64" (what pentad writes; format version 2)
  // or "crc32" (zlib's; version 1 checkpoints, still read).
  std::string checksum = "xxh3-64";
  struct Entry {
    std::string file;  // rank file, relative to the checkpoint directory
    ShardInfo shard;
  };
  std::vector<Entry> shards;  // every shard of every file
  // A survivors' rank file's manifest only (write_survivor): how many tensors the whole state
  // has, what its ranks' files together must hold. -1: not recorded (every committed one).
  int64_t tensors = -1;
};

std::string checkpoint_dir(const std::string& root, int64_t step);  // <root>/step-<N>
std::string partial_dir(const std::string& root, int64_t step);     // <root>/step-<N>.partial
std::string rank_file_name(int rank);                               // rank-<5 digits>.h5

// Writes one rank's HDF5 file with every shard (computing the checksums not given), then a
// sidecar <path>.json listing the shards, and fsyncs both. Creates the parent directory.
// Where the file system has less room than the file needs, fails before writing anything,
// in one line: the path, "No space left on device" and the bytes needed and free.
// Shard data at page-aligned addresses goes to disk with direct I/O (no copy through the
// page cache) where the file system allows it; direct_io = false writes everything
// buffered (the benchmark's peer). Throws pentad::Error naming the file on any failure.
// recycle: where <root>/recycled holds this rank's file of a checkpoint no longer kept
// (remove_dirs(..., true) puts it there), the new file is written over it instead of into
// newly allocated blocks (bytes identical to a fresh file): on ext4 that overwrite took
// half the time of a fresh write, and nothing has to free the old file's blocks.
// Returns whether it wrote over a recycled file.
bool write_rank_file(const std::string& path, const std::vector<ShardData>& shards,
                     bool direct_io = true, bool recycle = false);
std::string recycle_dir(const std::string& root);  // <root>/recycled

// Rank 0, once every rank's file and sidecar exist in partial_dir(root, base.step): merges
// the sidecars into manifest.json (with base's step, layout, recipe), fsyncs, renames the
// directory to checkpoint_dir(root, step) and fsyncs root. Then retires all but the newest
// keep_last committed checkpoints (keep_last <= 0 keeps all), a replaced copy of this step
// and stale .partial dirs: renames each to <name>.deleting, where no listing or resume sees
// it, and returns those paths, with any .deleting left by an earlier run. Deleting them is
// the caller's (remove_dirs): freeing a multi-GiB file can take most of a second (on a
// file system mounted with discard), which the trainer keeps off its training thread.
// Where base names a tokenizer (tokenizer_file), its bytes come as `tokenizer` (their sha256
// must be base.tokenizer_sha256) and are written into the directory, fsynced, before the
// manifest: the copy is part of what the rename commits.
[[nodiscard]] std::vector<std::string> commit(const std::string& root, const Manifest& base,
                                              int keep_last, std::string_view tokenizer = {});

// The names a carried tokenizer may have: Hugging Face's byte-level BPE, SentencePiece's model.
inline constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer.model"};
// The tokenizer committed checkpoint `dir` carries, as <dir>/<file> ("" where it carries
// none), after checking its bytes against the manifest's sha256; throws pentad::Error
// naming the file where it is missing or differs.
std::string carried_tokenizer(const std::string& dir, const Manifest& manifest);
// Deletes directories (what commit() retired); errors cost disk space only and are ignored.
void remove_dirs(const std::vector<std::string>& dirs);
// Moves the rank files of retired directories to recycle_dir(<their root>), one per rank
// name, for write_rank_file(..., recycle) to write over (before remove_dirs).
void pool_rank_files(const std::vector<std::string>& dirs);

// The survivors' state. When a job is ended (SIGTERM: mpirun after one of its ranks died, or
// pentad launch ending it), each rank that can writes all it holds of its live state, its
// replicas' copies too, into survivors_dir(root, base.step, tag) (`tag`: one per job, so
// that two attempts never mix): its rank file and sidecar, then `base` with the file's shards
// (base.tensors: the whole state's count) as rank-<5 digits>.base.json. A rank file without
// its base is incomplete.
std::string survivors_dir(const std::string& root, int64_t step, const std::string& tag);
void write_survivor(const std::string& root, int rank, const std::string& tag, const Manifest& base,
                    const std::vector<ShardData>& shards, std::string_view tokenizer = {});
// Before --resume latest picks (one rank): the newest survivors' directory newer than root's
// newest committed checkpoint whose complete files together hold every tensor (as many as
// the bases count, each whole, and those of the newest committed checkpoint with the same
// shapes) becomes the committed checkpoint of its step, each shard listed once. The
// tokenizer comes from rank 0's base (its bytes beside it) or else the newest committed
// checkpoint. Survivors' directories no newer than the newest committed checkpoint then go;
// incomplete newer ones stay. Where `logged_step` >= 0 (the last step the run's log holds),
// none past it is adopted: the survivors may be a step past the last loss logged (a rank's
// state is at step N once its optimizer step ends, the log's row comes after), and a resume
// from them would leave step N without a loss. Returns a line for each directory looked at.
std::vector<std::string> adopt_survivors(const std::string& root, int64_t logged_step = -1);

// Committed checkpoints under root, newest first (directories with a manifest.json).
std::vector<std::string> committed_checkpoints(const std::string& root);
// Directories under root named like a committed checkpoint (step-<N>) but without a
// manifest.json (deleted or lost): no resume can use them. Newest first.
std::vector<std::string> checkpoints_without_manifest(const std::string& root);
// The step a checkpoint directory's name gives (<root>/step-<N> -> N); nullopt for another name.
std::optional<int64_t> checkpoint_step(const std::string& dir);
// Moves checkpoint directory dir (<root>/step-<N>) into <root>/<folder>/ (created), where no
// listing, resume or retention sees it and nothing deletes it; a name already taken there gets
// a suffix .1, .2, ... Returns the new path; throws pentad::Error naming both on failure.
std::string set_aside(const std::string& dir, const std::string& folder);

class Reader {
 public:
  // Parses manifest.json; throws pentad::Error naming the file if missing or malformed.
  explicit Reader(const std::string& dir);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const Manifest& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const;
  std::vector<std::string> tensor_names() const;
  Shape global_shape(const std::string& name) const;

  // Fills out (local_shape, row-major f32) with the slice [shard_start, shard_start +
  // local_shape[shard_dim]) along shard_dim of global tensor `name` (shard_dim -1: whole),
  // reading it from whichever stored shards overlap it. Every stored shard it touches is
  // verified against its checksum once; a mismatch, a missing tensor or a shape that
  // differs throws pentad::Error naming the file and the tensor.
  // row_start: only local_shape[0] rows of the slice from this row on (a ZeRO share).
  void read(const std::string& name, const Shape& global_shape, int shard_dim, int64_t shard_start,
            const Shape& local_shape, float* out, int64_t row_start = 0, int shard_dim2 = -1,
            int64_t shard_start2 = 0);

  // Reads every stored shard not yet verified and checks its checksum; returns the number
  // of shards. Throws the first error (naming file and tensor).
  int64_t verify_all();

 private:
  struct Impl;
  std::string dir_;
  Manifest manifest_;
  Impl* impl_ = nullptr;
};

// `pentad ckpt inspect`: step, layout, the recorded recipe (TOML), every tensor with shape,
// shards and bytes; with verify, reads every shard and checks its checksum (errors name
// file+tensor).
std::string inspect(const std::string& dir, bool verify);

}  // namespace pentad::ckpt
