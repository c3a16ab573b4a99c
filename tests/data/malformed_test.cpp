// Every malformed input a user can hand us, each checked for a message that names the
// file and the problem.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "core/check.h"
#include "data/dataset.h"
#include "data/token_files.h"
#include "data/tokenizer.h"
#include "test_files.h"

namespace pentad::data {
namespace {

using testing::ScratchDir;

// A valid 3-document uint16 Megatron pair at dir/x, returned as (idx bytes, bin bytes).
std::pair<std::vector<uint8_t>, std::vector<uint8_t>> good_megatron(const ScratchDir& dir) {
  MegatronWriter writer(dir.file("x"), TokenDType::U16);
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {5, 6}, c = {7, 8, 9};
  writer.add_document(a);
  writer.add_document(b);
  writer.add_document(c);
  writer.finish();
  return {testing::read_bytes(dir.file("x.idx")), testing::read_bytes(dir.file("x.bin"))};
}

void write_idx(const ScratchDir& dir, std::vector<uint8_t> idx) {
  testing::write_bytes(dir.file("x.idx"), idx);
}

void write_llmc(const ScratchDir& dir, int32_t magic, int32_t version, int32_t count,
                size_t token_bytes) {
  std::vector<uint8_t> bytes(1024 + token_bytes, 0);
  const int32_t header[3] = {magic, version, count};
  std::memcpy(bytes.data(), header, 12);
  testing::write_bytes(dir.file("shard.bin"), bytes);
}

void open_megatron(const ScratchDir& dir) {
  MegatronDataset::open(dir.file("x"));
}
void open_llmc(const ScratchDir& dir) {
  LlmcShard::open(dir.file("shard.bin"));
}

const char* kTinyVocab = R"("vocab": {"a": 0, "b": 1, "ab": 2})";

void load_tokenizer(const ScratchDir& dir, const std::string& json) {
  testing::write_text(dir.file("tok.json"), json);
  Tokenizer::load(dir.file("tok.json"));
}

std::string tokenizer_json(const std::string& model,
                           const std::string& pre = R"({"type": "ByteLevel"})") {
  return R"({"pre_tokenizer": )" + pre + R"(, "model": )" + model + "}";
}

struct Case {
  std::string name;
  std::function<void(const ScratchDir&)> run;
  std::vector<std::string> expected;  // substrings of the message
};

// The bad inputs, by kind: Megatron .idx / .bin pairs, llm.c shards, token ids beyond the
// model's vocabulary, recipe-level data errors, tokenizer.json files.
std::vector<Case> bad_inputs() {
  return {
      // ---- Megatron .idx / .bin ----
      {"megatron missing index",
       [](const ScratchDir& d) { open_megatron(d); },
       {"x.idx", "index file not found"}},
      {"megatron bad magic",
       [](const ScratchDir& d) {
         auto [idx, bin] = good_megatron(d);
         idx[0] = 'X';
         write_idx(d, idx);
         open_megatron(d);
       },
       {"x.idx", "bad magic"}},
      {"megatron truncated header",
       [](const ScratchDir& d) {
         auto [idx, bin] = good_megatron(d);
         idx.resize(20);
         write_idx(d, idx);
         open_megatron(d);
       },
       {"x.idx", "truncated index"}},
      {"megatron truncated arrays",
       [](const ScratchDir& d) {
         auto [idx, bin] = good_megatron(d);
         idx.resize(idx.size() - 5);
         write_idx(d, idx);
         open_megatron(d);
       },
       {"x.idx", "truncated index"}},
      {"megatron wrong version",
       [](const ScratchDir& d) {
         auto [idx, bin] = good_megatron(d);
         idx[9] = 2;
         write_idx(d, idx);
         open_megatron(d);
       },
       {"x.idx", "unsupported index version 2"}},
      {"megatron unknown dtype",
       [](const ScratchDir& d) {
         auto [idx, bin] = good_megatron(d);
         idx[17] = 7;  // float32
         write_idx(d, idx);
         open_megatron(d);
       },
       {"x.idx", "unknown dtype code 7"}},
      {"megatron trailing index bytes",
       [](const ScratchDir& d) {
         auto [idx, bin] = good_megatron(d);
         idx.insert(idx.end(), {0, 0});
         write_idx(d, idx);
         open_megatron(d);
       },
       {"x.idx", "size mismatch"}},
      {"megatron corrupt document indices",
       [](const ScratchDir& d) {
         auto [idx, bin] = good_megatron(d);
         idx[idx.size() - 8] = 9;  // last document index != sequence count
         write_idx(d, idx);
         open_megatron(d);
       },
       {"x.idx", "corrupt document indices"}},
      {"megatron truncated bin",
       [](const ScratchDir& d) {
         auto [idx, bin] = good_megatron(d);
         bin.resize(bin.size() - 2);
         testing::write_bytes(d.file("x.bin"), bin);
         open_megatron(d);
       },
       {"x.bin", "truncated data file"}},
      {"megatron bin longer than index says",
       [](const ScratchDir& d) {
         auto [idx, bin] = good_megatron(d);
         bin.insert(bin.end(), {0, 0, 0, 0});
         testing::write_bytes(d.file("x.bin"), bin);
         open_megatron(d);
       },
       {"x.bin", "size mismatch"}},
      {"megatron missing bin",
       [](const ScratchDir& d) {
         good_megatron(d);
         std::filesystem::remove(d.file("x.bin"));
         open_megatron(d);
       },
       {"x.bin", "cannot open"}},
      // ---- llm.c shards ----
      {"llmc bad magic",
       [](const ScratchDir& d) {
         write_llmc(d, 1234, 1, 4, 8);
         open_llmc(d);
       },
       {"shard.bin", "bad magic"}},
      {"llmc truncated header",
       [](const ScratchDir& d) {
         std::vector<uint8_t> bytes(100, 0);
         const int32_t magic = 20240520;
         std::memcpy(bytes.data(), &magic, 4);
         testing::write_bytes(d.file("shard.bin"), bytes);
         open_llmc(d);
       },
       {"shard.bin", "truncated"}},
      {"llmc wrong version",
       [](const ScratchDir& d) {
         write_llmc(d, 20240520, 7, 4, 8);
         open_llmc(d);
       },
       {"shard.bin", "unsupported llm.c shard version 7"}},
      {"llmc truncated tokens",
       [](const ScratchDir& d) {
         write_llmc(d, 20240520, 1, 10, 8);
         open_llmc(d);
       },
       {"shard.bin", "truncated: header says 10 tokens"}},
      {"llmc trailing bytes",
       [](const ScratchDir& d) {
         write_llmc(d, 20240520, 1, 2, 8);
         open_llmc(d);
       },
       {"shard.bin", "size mismatch"}},
      // ---- token ids beyond the model's vocabulary ----
      {"megatron token >= vocab",
       [](const ScratchDir& d) {
         good_megatron(d);  // largest token 9
         DataConfig cfg;
         cfg.source = "megatron";
         cfg.path = d.file("x");
         cfg.val_fraction = 0;
         DataLoader::open(cfg, 2, 9, 0);
       },
       {"x.bin", "token id 9 at token 8", "vocabulary [0, 9)"}},
      {"llmc token >= vocab",
       [](const ScratchDir& d) {
         const std::vector<int32_t> tokens = {1, 2, 3, 500, 4, 5};
         write_llmc_shard(d.file("shard.bin"), tokens);
         DataConfig cfg;
         cfg.source = "llmc";
         cfg.path = d.file("shard.bin");
         cfg.val_fraction = 0;
         DataLoader::open(cfg, 2, 256, 0);
       },
       {"shard.bin", "token id 500 at token 3"}},
      // ---- recipe-level data errors ----
      {"unknown source",
       [](const ScratchDir&) {
         DataConfig cfg;
         cfg.source = "parquet";
         DataLoader::open(cfg, 8, 256, 0);
       },
       {"data.source = \"parquet\" is unknown"}},
      {"megatron without path",
       [](const ScratchDir&) {
         DataConfig cfg;
         cfg.source = "megatron";
         DataLoader::open(cfg, 8, 256, 0);
       },
       {"data.path is empty"}},
      {"llmc glob matching nothing",
       [](const ScratchDir& d) {
         DataConfig cfg;
         cfg.source = "llmc";
         cfg.path = d.file("nothing_*.bin");
         DataLoader::open(cfg, 8, 256, 0);
       },
       {"nothing_*.bin", "no llm.c shard matches"}},
      {"too little data to split",
       [](const ScratchDir& d) {
         good_megatron(d);  // 9 tokens
         DataConfig cfg;
         cfg.source = "megatron";
         cfg.path = d.file("x");
         DataLoader::open(cfg, 4, 256, 0);
       },
       {"x", "too few to split"}},
      {"less than one sample",
       [](const ScratchDir& d) {
         good_megatron(d);  // 9 tokens
         DataConfig cfg;
         cfg.source = "megatron";
         cfg.path = d.file("x");
         cfg.val_fraction = 0;
         DataLoader::open(cfg, 9, 256, 0);
       },
       {"x.bin", "fewer than one sample"}},
      // ---- tokenizer.json ----
      {"tokenizer missing",
       [](const ScratchDir& d) { Tokenizer::load(d.file("none.json")); },
       {"none.json", "cannot open tokenizer file"}},
      {"tokenizer not json",
       [](const ScratchDir& d) { load_tokenizer(d, "{\"model\": [1, 2"); },
       {"tok.json", "not a valid JSON file"}},
      {"tokenizer without model",
       [](const ScratchDir& d) { load_tokenizer(d, "{\"version\": \"1.0\"}"); },
       {"tok.json", "no \"model\" object"}},
      {"tokenizer not BPE",
       [](const ScratchDir& d) {
         load_tokenizer(d, tokenizer_json(R"({"type": "WordPiece", "vocab": {}})"));
       },
       {"tok.json", "model type is \"WordPiece\"", "only \"BPE\""}},
      {"tokenizer not byte-level",
       [](const ScratchDir& d) {
         load_tokenizer(d, tokenizer_json(std::string(R"({"type": "BPE", )") + kTinyVocab +
                                              R"(, "merges": []})",
                                          R"({"type": "Metaspace"})"));
       },
       {"tok.json", "pre_tokenizer is not ByteLevel"}},
      {"tokenizer merges missing",
       [](const ScratchDir& d) {
         load_tokenizer(d, tokenizer_json(std::string(R"({"type": "BPE", )") + kTinyVocab + "}"));
       },
       {"tok.json", "model.merges missing"}},
      {"tokenizer merge with unknown token",
       [](const ScratchDir& d) {
         load_tokenizer(d, tokenizer_json(std::string(R"({"type": "BPE", )") + kTinyVocab +
                                          R"(, "merges": ["a q"]})"));
       },
       {"tok.json", "merge 0 references unknown token \"q\""}},
      {"tokenizer merge result not in vocab",
       [](const ScratchDir& d) {
         load_tokenizer(d, tokenizer_json(std::string(R"({"type": "BPE", )") + kTinyVocab +
                                          R"(, "merges": ["a b", "b a"]})"));
       },
       {"tok.json", "merge 1 \"b a\" produces \"ba\", which is not in the vocab"}},
      {"tokenizer malformed merge",
       [](const ScratchDir& d) {
         load_tokenizer(d, tokenizer_json(std::string(R"({"type": "BPE", )") + kTinyVocab +
                                          R"(, "merges": ["ab"]})"));
       },
       {"tok.json", "merge 0 \"ab\" is not of the form"}},
      {"tokenizer ids with a gap",
       [](const ScratchDir& d) {
         load_tokenizer(
             d, tokenizer_json(R"({"type": "BPE", "vocab": {"a": 0, "b": 2}, "merges": []})"));
       },
       {"tok.json", "not contiguous: id 1 is missing"}},
      {"tokenizer token outside the byte alphabet",
       [](const ScratchDir& d) {
         load_tokenizer(
             d, tokenizer_json(R"({"type": "BPE", "vocab": {"a": 0, "a b": 1}, "merges": []})"));
       },
       {"tok.json", "\"a b\" (id 1)", "outside the byte-level alphabet"}},
  };
}

TEST(Malformed, EveryBadInputGetsASpecificMessage) {
  for (const Case& c : bad_inputs()) {
    SCOPED_TRACE(c.name);
    ScratchDir dir;
    try {
      c.run(dir);
      ADD_FAILURE() << c.name << ": no error";
    } catch (const Error& e) {
      const std::string message = e.what();
      for (const auto& want : c.expected) {
        EXPECT_NE(message.find(want), std::string::npos)
            << c.name << ": \"" << message << "\" lacks \"" << want << "\"";
      }
    }
  }
}

}  // namespace
}  // namespace pentad::data
