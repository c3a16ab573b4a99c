// The `tokenizer train` and `data prepare` actions, end to end on real files.
#include "cli/data_commands.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "../data/test_files.h"
#include "core/check.h"
#include "data/dataset.h"
#include "data/tokenizer.h"

namespace pentad::data {
namespace {

using testing::ScratchDir;

TEST(Commands, TrainTokenizerThenPrepareData) {
  ScratchDir dir;
  testing::write_text(dir.file("a.txt"),
                      "Hello there, world!\n%\nSecond fortune here.\n%\nHello again.\n");
  testing::write_text(dir.file("b.txt"), "Another file, another document. Hello!\n");
  tokenizer_train({dir.file("a.txt"), dir.file("b.txt")}, 300, dir.file("tok.json"));
  const Tokenizer tok = Tokenizer::load(dir.file("tok.json"));
  EXPECT_EQ(tok.vocab_size(), 300);

  PrepareOptions prep;
  prep.inputs = {dir.file("a.txt"), dir.file("b.txt")};
  prep.tokenizer_json = dir.file("tok.json");
  prep.out_prefix = dir.file("fortune");
  prep.fortune_format = true;
  data_prepare(prep);
  const MegatronDataset fortunes = MegatronDataset::open(dir.file("fortune"));
  ASSERT_EQ(fortunes.num_documents(), 4);
  auto second = fortunes.document(1);
  EXPECT_EQ(second.back(), tok.eot_id());
  second.pop_back();
  EXPECT_EQ(tok.decode(second), "Second fortune here.\n");

  prep.out_prefix = dir.file("whole");
  prep.fortune_format = false;
  data_prepare(prep);
  EXPECT_EQ(MegatronDataset::open(dir.file("whole")).num_documents(), 2);
}

// Issue 45: --vocab-size 5000 on a little text gave 337 tokens without a word.
TEST(Commands, TrainTokenizerRefusesAVocabularyTheTextCannotGive) {
  ScratchDir dir;
  testing::write_text(dir.file("a.txt"), "Hello there, world! Hello again, world.\n");
  try {
    tokenizer_train({dir.file("a.txt")}, 5000, dir.file("tok.json"));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("not the 5000 of --vocab-size"), std::string::npos) << message;
    EXPECT_NE(message.find("Give more text, or --vocab-size"), std::string::npos) << message;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("tok.json")));
}

// Batches of a few documents each, so that every batch but the first is read while the one
// before it is encoded and written on the worker: the same files as one batch for all.
TEST(Commands, PrepareIsTheSameForAnyBatchSize) {
  ScratchDir dir;
  std::string jsonl, text;
  for (int i = 0; i < 200; ++i) {
    const std::string doc =
        "document " + std::to_string(i) + ": " + std::string(size_t(i % 17), 'x');
    jsonl += "{\"text\": \"" + doc + "\"}\n";
    text += doc + " ";
  }
  testing::write_text(dir.file("docs.jsonl"), jsonl);
  testing::write_text(dir.file("all.txt"), text);
  tokenizer_train({dir.file("all.txt")}, 300, dir.file("tok.json"));
  PrepareOptions prep;
  prep.inputs = {dir.file("docs.jsonl")};
  prep.tokenizer_json = dir.file("tok.json");
  prep.threads = 2;
  prep.out_prefix = dir.file("one");
  data_prepare(prep);
  prep.out_prefix = dir.file("many");
  prep.batch_bytes = 64;
  data_prepare(prep);
  const MegatronDataset one = MegatronDataset::open(dir.file("one"));
  const MegatronDataset many = MegatronDataset::open(dir.file("many"));
  ASSERT_EQ(one.num_documents(), 200);
  ASSERT_EQ(many.num_documents(), 200);
  for (int64_t d = 0; d < 200; ++d) EXPECT_EQ(one.document(d), many.document(d)) << d;
}

}  // namespace
}  // namespace pentad::data
