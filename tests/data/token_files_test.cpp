// Megatron .bin/.idx and llm.c shards: write -> read round trips, and the byte layout.
#include "data/token_files.h"

#include <gtest/gtest.h>

#include <cstring>

#include "test_files.h"

namespace pentad::data {
namespace {

using testing::ScratchDir;

const std::vector<std::vector<int32_t>> kDocuments = {
    {5, 6, 7, 0}, {1}, {}, {65535, 2, 3, 4, 5, 6, 7, 8, 9, 0}, {42, 0}};

TEST(Megatron, WriteReadRoundTrip) {
  ScratchDir dir;
  for (TokenDType dtype : {TokenDType::U16, TokenDType::I32}) {
    const std::string prefix = dir.file(std::string("docs-") + token_dtype_name(dtype));
    MegatronWriter writer(prefix, dtype);
    for (const auto& doc : kDocuments) writer.add_document(doc);
    writer.finish();

    const MegatronDataset ds = MegatronDataset::open(prefix);
    EXPECT_EQ(ds.dtype(), dtype);
    ASSERT_EQ(ds.num_documents(), static_cast<int64_t>(kDocuments.size()));
    ASSERT_EQ(ds.num_sequences(), static_cast<int64_t>(kDocuments.size()));
    EXPECT_EQ(ds.num_tokens(), 17);
    for (size_t d = 0; d < kDocuments.size(); ++d)
      EXPECT_EQ(ds.document(static_cast<int64_t>(d)), kDocuments[d]);
    // No temporaries left behind.
    int files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
      files += entry.path().string().rfind(prefix, 0) == 0;
    }
    EXPECT_EQ(files, 2);
  }
}

// The .idx layout of Megatron-LM's indexed_dataset.py, checked byte by byte.
TEST(Megatron, IndexLayoutMatchesMegatronLM) {
  ScratchDir dir;
  MegatronWriter writer(dir.file("x"), TokenDType::U16);
  const std::vector<int32_t> a = {1, 2, 3}, b = {4, 5};
  writer.add_document(a);
  writer.add_document(b);
  writer.finish();
  const auto idx = testing::read_bytes(dir.file("x.idx"));
  ASSERT_EQ(idx.size(), 34u + 2 * 4 + 2 * 8 + 3 * 8);
  EXPECT_EQ(std::memcmp(idx.data(), "MMIDIDX\0\0", 9), 0);
  auto u64 = [&](size_t at) {
    uint64_t v;
    std::memcpy(&v, idx.data() + at, 8);
    return v;
  };
  auto i32 = [&](size_t at) {
    int32_t v;
    std::memcpy(&v, idx.data() + at, 4);
    return v;
  };
  EXPECT_EQ(u64(9), 1u);   // version
  EXPECT_EQ(idx[17], 8);   // uint16
  EXPECT_EQ(u64(18), 2u);  // sequences
  EXPECT_EQ(u64(26), 3u);  // document indices (documents + 1)
  EXPECT_EQ(i32(34), 3);   // sizes
  EXPECT_EQ(i32(38), 2);
  EXPECT_EQ(u64(42), 0u);  // pointers, in bytes
  EXPECT_EQ(u64(50), 6u);
  EXPECT_EQ(u64(58), 0u);  // document indices
  EXPECT_EQ(u64(66), 1u);
  EXPECT_EQ(u64(74), 2u);
  EXPECT_EQ(testing::read_bytes(dir.file("x.bin")).size(), 10u);
}

TEST(Megatron, ReadsMultiSequenceDocuments) {
  // Two documents: sequences {0,1} and {2}, written by hand with pointers out of order.
  ScratchDir dir;
  std::vector<uint8_t> idx(34 + 3 * 12 + 3 * 8);
  std::memcpy(idx.data(), "MMIDIDX\0\0", 9);
  const uint64_t version = 1, n_seq = 3, n_doc = 3;
  std::memcpy(idx.data() + 9, &version, 8);
  idx[17] = 4;  // int32
  std::memcpy(idx.data() + 18, &n_seq, 8);
  std::memcpy(idx.data() + 26, &n_doc, 8);
  const int32_t sizes[3] = {2, 1, 3};
  const int64_t pointers[3] = {12, 20, 0};  // bytes
  const int64_t docs[3] = {0, 2, 3};
  std::memcpy(idx.data() + 34, sizes, 12);
  std::memcpy(idx.data() + 46, pointers, 24);
  std::memcpy(idx.data() + 70, docs, 24);
  testing::write_bytes(dir.file("m.idx"), idx);
  const int32_t bin[6] = {30, 31, 32, 10, 11, 20};
  std::vector<uint8_t> bin_bytes(24);
  std::memcpy(bin_bytes.data(), bin, 24);
  testing::write_bytes(dir.file("m.bin"), bin_bytes);

  const MegatronDataset ds = MegatronDataset::open(dir.file("m"));
  EXPECT_EQ(ds.num_documents(), 2);
  EXPECT_EQ(ds.document(0), (std::vector<int32_t>{10, 11, 20}));
  EXPECT_EQ(ds.document(1), (std::vector<int32_t>{30, 31, 32}));
}

TEST(Llmc, ShardRoundTrip) {
  ScratchDir dir;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 1000; ++i) tokens.push_back((i * 7919) % 65536);
  write_llmc_shard(dir.file("shard.bin"), tokens);
  const auto bytes = testing::read_bytes(dir.file("shard.bin"));
  ASSERT_EQ(bytes.size(), 1024u + 2000u);
  int32_t header[3];
  std::memcpy(header, bytes.data(), 12);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 1000);

  const LlmcShard shard = LlmcShard::open(dir.file("shard.bin"));
  ASSERT_EQ(shard.num_tokens(), 1000);
  EXPECT_EQ(shard.dtype(), TokenDType::U16);
  for (int64_t i = 0; i < 1000; ++i)
    EXPECT_EQ(read_token(shard.token_data(), shard.dtype(), i), tokens[static_cast<size_t>(i)]);
}

}  // namespace
}  // namespace pentad::data
