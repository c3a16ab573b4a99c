// The default fortunes corpus, end to end on real files.
#include "data/corpus.h"

#include <gtest/gtest.h>

#include "core/check.h"
#include "data/dataset.h"
#include "data/token_files.h"
#include "data/tokenizer.h"
#include "test_files.h"

namespace pentad::data {
namespace {

using testing::ScratchDir;

TEST(Corpus, SplitsFortunesAtPercentLines) {
  const auto docs = split_fortunes("first\nline\n%\n%\n  \n%\nsecond\r\n%\r\nthird");
  EXPECT_EQ(docs, (std::vector<std::string>{"first\nline\n", "second\r\n", "third"}));
}

TEST(Corpus, PreparesTheFortunesOnceAndDecodesBack) {
  if (!std::filesystem::is_directory(kFortuneDir))
    GTEST_SKIP() << "fortunes not installed (scripts/setup.sh)";
  ScratchDir dir;
  DataConfig cfg;
  cfg.cache_dir = dir.file("cache");
  const std::string prefix = prepare_default_corpus(cfg, 512);
  EXPECT_EQ(prefix, dir.file("cache/fortunes-bpe512"));
  const auto idx_time = std::filesystem::last_write_time(prefix + ".idx");
  EXPECT_EQ(prepare_default_corpus(cfg, 512), prefix);  // second call: opens, rebuilds nothing
  EXPECT_EQ(std::filesystem::last_write_time(prefix + ".idx"), idx_time);

  const Tokenizer tok = Tokenizer::load(prefix + ".json");
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(tok.eot_id(), 511);
  const MegatronDataset ds = MegatronDataset::open(prefix);
  EXPECT_EQ(ds.dtype(), TokenDType::U16);
  EXPECT_GT(ds.num_documents(), 5000);
  std::string text;
  for (int64_t d = 0; d < ds.num_documents(); ++d) {
    auto ids = ds.document(d);
    ASSERT_EQ(ids.back(), tok.eot_id());
    ids.pop_back();
    text += tok.decode(ids);
  }
  EXPECT_NE(text.find("Voltaire"), std::string::npos);
  EXPECT_NE(text.find("The one charm of marriage"), std::string::npos);

  cfg.source = "fortunes";  // and through the loader
  const DataLoader loader = DataLoader::open(cfg, 64, 512, 1);
  EXPECT_EQ(loader.train_tokens() + loader.val_tokens(), ds.num_tokens());
  EXPECT_GT(loader.val_windows(), 0);
}

TEST(Corpus, MissingCorpusSaysHowToInstallIt) {
  ScratchDir dir;
  DataConfig cfg;
  cfg.cache_dir = dir.file("cache");
  try {
    prepare_default_corpus(cfg, 512, dir.file("no-fortunes"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("no-fortunes"), std::string::npos) << message;
    EXPECT_NE(message.find("scripts/setup.sh"), std::string::npos) << message;
  }
}

TEST(Corpus, UsesAGivenTokenizer) {
  if (!std::filesystem::is_directory(kFortuneDir))
    GTEST_SKIP() << "fortunes not installed (scripts/setup.sh)";
  ScratchDir dir;
  Tokenizer::train("a small text to learn a few merges from, a small text", 300)
      .save(dir.file("tok.json"));
  DataConfig cfg;
  cfg.cache_dir = dir.file("cache");
  cfg.tokenizer = dir.file("tok.json");
  const std::string prefix = prepare_default_corpus(cfg, 300);
  EXPECT_NE(prefix.find("fortunes-"), std::string::npos);
  EXPECT_EQ(prefix.find("bpe"), std::string::npos);
  EXPECT_EQ(default_corpus_tokenizer(cfg, 300), cfg.tokenizer);
  EXPECT_GT(MegatronDataset::open(prefix).num_documents(), 5000);
}

}  // namespace
}  // namespace pentad::data
