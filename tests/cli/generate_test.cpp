// `pentad generate` and the tokenizer a checkpoint carries (issue 45): the copy is used from
// any directory, checked against its sha256, ends a continuation at end-of-text even from
// prompt ids, and the summary line stays off stdout.
#include "cli/generate.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/sha256.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "recipe/recipe.h"

namespace fs = std::filesystem;
using namespace pentad;

namespace {

std::string generate_dir(const std::string& tag) {
  const fs::path dir =
      fs::temp_directory_path() / ("pentad_generate_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string generate_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A 300-token byte-level BPE learned on a little text; <|endoftext|> is one of its ids.
data::Tokenizer small_tokenizer() {
  return data::Tokenizer::train(
      "the fortune of the day: you will find the fortune you seek, the day after tomorrow. ", 300);
}

// A one-layer GPT-2 whose every next token is the end-of-text: the final norm outputs its bias
// b alone (weight 0), and the tied embedding row of <|endoftext|> is 10 b, every other row 0.
// The recipe names a tokenizer file that does not exist (its run was elsewhere); the
// checkpoint carries the tokenizer when `carry`.
std::string eot_checkpoint(const std::string& root, const data::Tokenizer& tokenizer, bool carry) {
  Config cfg = parse_recipe("", "test");
  cfg.model.family = ModelFamily::GPT2;
  cfg.model.n_layer = 1;
  cfg.model.d_model = 8;
  cfg.model.n_head = 2;
  cfg.model.vocab_size = 304;
  cfg.model.max_seq_len = 32;
  cfg.train.seq_len = 32;
  cfg.data.tokenizer = root + "/elsewhere/tokenizer.json";
  cfg = parse_recipe(recipe_to_toml(cfg), "test");
  Model model(cfg.model, 1, 1);
  std::vector<std::vector<float>> values;
  std::vector<ckpt::ShardData> shards;
  const int32_t eot = tokenizer.eot_id();
  for (const ParamSpec& s : model.params().specs()) {
    std::vector<float> v(static_cast<size_t>(s.global_shape.numel()), 0.0f);
    if (s.name == "norm_f.bias")
      for (size_t i = 0; i < v.size(); ++i) v[i] = (i % 2 ? 1.0f : -1.0f);
    if (s.name == "wte.weight")
      for (int64_t c = 0; c < cfg.model.d_model; ++c)
        v[size_t(eot * cfg.model.d_model + c)] = (c % 2 ? 10.0f : -10.0f);
    values.push_back(std::move(v));
    ckpt::ShardData shard;
    shard.info.name = "param/" + s.name;
    shard.info.global_shape = s.global_shape;
    shard.info.local_shape = s.global_shape;
    shards.push_back(shard);
  }
  for (size_t i = 0; i < shards.size(); ++i) shards[i].data = values[i].data();
  ckpt::write_rank_file(ckpt::partial_dir(root, 1) + "/" + ckpt::rank_file_name(0), shards);
  ckpt::Manifest m;
  m.step = 1;
  m.recipe_toml = recipe_to_toml(cfg);
  std::string bytes;
  if (carry) {
    tokenizer.save(root + "/source.json");
    std::ifstream in(root + "/source.json", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    m.tokenizer_file = "tokenizer.json";
    m.tokenizer_sha256 = ckpt::sha256_hex(bytes);
  }
  ckpt::remove_dirs(ckpt::commit(root, m, 0, bytes));
  return ckpt::checkpoint_dir(root, 1);
}

}  // namespace

TEST(Sha256, KnownDigests) {  // FIPS 180-4's examples, and a message over one block's tail
  EXPECT_EQ(ckpt::sha256_hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(ckpt::sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(ckpt::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(ckpt::sha256_hex(std::string(1000, 'a')),
            "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
}

TEST(Generate, UsesTheCarriedTokenizerFromAnyDirectory) {
  const std::string work = generate_dir("carried");
  const data::Tokenizer tokenizer = small_tokenizer();
  const std::string dir = eot_checkpoint(work + "/ckpt", tokenizer, true);
  EXPECT_TRUE(fs::exists(dir + "/tokenizer.json"));
  ckpt::GenerateOptions o;
  o.checkpoint = dir;
  o.prompt = "the fortune";
  o.max_tokens = 5;
  // The recipe's data.tokenizer does not exist: before issue 45 this was "the recipe's
  // tokenizer is missing".
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const std::string error = generate_error([&] { ckpt::generate(o); });
  const std::string out = testing::internal::GetCapturedStdout();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(error, "(no error)");
  // The first token is the end of the text: nothing to print, and the summary says why, on
  // stderr: stdout holds the continuation alone.
  EXPECT_EQ(out, "\n");
  EXPECT_NE(err.find("generate: 1 tokens in"), std::string::npos) << err;
  EXPECT_NE(err.find("stopped at the end-of-text token"), std::string::npos) << err;
  // A changed copy is named, with both hashes.
  std::ofstream(dir + "/tokenizer.json", std::ios::app) << " ";
  const std::string changed = generate_error([&] { ckpt::generate(o); });
  EXPECT_NE(changed.find(dir + "/tokenizer.json: sha256 "), std::string::npos) << changed;
  EXPECT_NE(changed.find("the file was changed"), std::string::npos) << changed;
  fs::remove_all(work);
}

TEST(Generate, PromptIdsStopAtEndOfText) {
  const std::string work = generate_dir("ids");
  const data::Tokenizer tokenizer = small_tokenizer();
  ckpt::GenerateOptions o;
  o.checkpoint = eot_checkpoint(work + "/ckpt", tokenizer, true);
  o.prompt_ids = "1,2,3";
  o.print_ids = true;
  o.max_tokens = 6;
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  ckpt::generate(o);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "\n");  // no id past the end of the text
  testing::internal::GetCapturedStderr();
  // --ignore-eos goes on to --max-tokens; so does a checkpoint without a tokenizer, which has
  // no end-of-text id to stop at.
  o.ignore_eos = true;
  const std::string eot = std::to_string(tokenizer.eot_id());
  std::string six = eot;
  for (int i = 1; i < 6; ++i) six += "," + eot;
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  ckpt::generate(o);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), six + "\n");
  testing::internal::GetCapturedStderr();
  ckpt::GenerateOptions bare = o;
  bare.ignore_eos = false;
  bare.checkpoint = eot_checkpoint(work + "/bare", tokenizer, false);
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  ckpt::generate(bare);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), six + "\n");
  testing::internal::GetCapturedStderr();
  // Text needs a tokenizer: the message says where none was found and what to pass.
  bare.prompt_ids.clear();
  bare.prompt = "the";
  const std::string none = generate_error([&] { ckpt::generate(bare); });
  EXPECT_NE(none.find("the recipe's tokenizer is missing; pass --tokenizer FILE"),
            std::string::npos)
      << none;
  fs::remove_all(work);
}
