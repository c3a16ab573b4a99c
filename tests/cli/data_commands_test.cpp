// The `tokenizer train` and `data prepare` actions, end to end on real files.
#include "cli/data_commands.h"

#include <gtest/gtest.h>

#include "../data/test_files.h"
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

}  // namespace
}  // namespace pentad::data
