// Byte-level BPE: pre-tokenization against GPT-2's regex, training against a brute-force
// reference, round trips, and the tokenizer.json format.
#include "data/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "core/check.h"
#include "test_files.h"

namespace pentad::data {
namespace {

using testing::ScratchDir;

const char* kText =
    "The quick brown fox jumps over the lazy dog. The dog didn't care; it'd seen foxes before.\n"
    "  Indented line with    runs of spaces\tand\ttabs.\r\n"
    "Numbers: 3.14159, 2718, 1,000,000 and 42nd street.\n\n\n"
    "We'll see what they've got -- they're sure it's fine, I'm told.\n"
    "UTF-8: naïve café, Straße, 日本語のテキスト, emoji 🙂🙃, Ελληνικά.\n"
    "the the the then them these those there their they\n";

std::string training_text() {
  std::string text;
  for (int i = 0; i < 20; ++i) text += kText;
  return text;
}

// Expected pieces computed with Python's `regex` and GPT-2's pattern
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
TEST(Pretokenize, MatchesGpt2Regex) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"Hello world's end", {"Hello", " world", "'s", " end"}},
      {"I'll  do it!!  ", {"I", "'ll", " ", " do", " it", "!!", "  "}},
      {"a\n\nb", {"a", "\n", "\n", "b"}},
      {"x \n y", {"x", " \n", " y"}},
      {"  leading", {" ", " leading"}},
      {"tab\there", {"tab", "\t", "here"}},
      {"don't?'s ok", {"don", "'t", "?'", "s", " ok"}},
      {"123abc 45.6", {"123", "abc", " 45", ".", "6"}},
      {"end  ", {"end", "  "}},
      {"\t \tword", {"\t ", "\t", "word"}},
      {"it's 'quoted'", {"it", "'s", " '", "quoted", "'"}},
      {"a\r\nb", {"a", "\r", "\n", "b"}},
      {"", {}},
      {"   ", {"   "}},
      {"x''s", {"x", "''", "s"}},
      {"hi ,there", {"hi", " ,", "there"}},
  };
  for (const auto& [text, expected] : cases) {
    std::vector<std::string> got;
    for (auto piece : pretokenize(text)) got.emplace_back(piece);
    EXPECT_EQ(got, expected) << "text: \"" << text << "\"";
  }
}

TEST(Pretokenize, KeepsUtf8CharactersWhole) {
  std::vector<std::string> got;
  for (auto piece : pretokenize("café 日本")) got.emplace_back(piece);
  EXPECT_EQ(got, (std::vector<std::string>{"café", " 日本"}));
}

TEST(Tokenizer, ByteAlphabetIsGpt2s) {
  EXPECT_EQ(byte_to_unicode(' '), "Ġ");
  EXPECT_EQ(byte_to_unicode('\n'), "Ċ");
  EXPECT_EQ(byte_to_unicode('a'), "a");
  EXPECT_EQ(byte_to_unicode(0), "Ā");
  EXPECT_EQ(byte_to_unicode(0xAD), "Ń");  // the last of the 68 remapped bytes (U+0143)
}

TEST(Tokenizer, RoundTripsVariedText) {
  const Tokenizer tok = Tokenizer::train(training_text(), 400);
  EXPECT_EQ(tok.vocab_size(), 400);
  EXPECT_EQ(tok.eot_id(), 399);
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes.push_back(static_cast<char>(b));
  const std::vector<std::string> samples = {
      "",
      " ",
      "\n\n\n",
      "   \t\t  \r\n  ",
      "The quick brown fox.",
      "unseen wörds ünïcödé 🦊 中文",
      "it's they'll we've I'd",
      "x  y   z    w",
      all_bytes,
      kText,
      "<|endoftext|> stays text",
  };
  for (const auto& s : samples) {
    const auto ids = tok.encode(s);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok.eot_id());
    EXPECT_EQ(tok.decode(ids), s);
  }
  // Merges compress: the training text needs far fewer tokens than bytes.
  EXPECT_LT(tok.encode(kText).size() * 2, std::string(kText).size());
}

TEST(Tokenizer, EncodeBatchMatchesEncode) {
  const Tokenizer tok = Tokenizer::train(training_text(), 350);
  std::vector<std::string> docs;
  for (int i = 0; i < 300; ++i)
    docs.push_back(std::string(kText).substr(static_cast<size_t>(i) % 50, 40 + i % 70));
  std::vector<std::string_view> views(docs.begin(), docs.end());
  const auto batch = tok.encode_batch(views);
  ASSERT_EQ(batch.size(), docs.size());
  for (size_t i = 0; i < docs.size(); ++i) EXPECT_EQ(batch[i], tok.encode(docs[i]));
}

TEST(Tokenizer, TrainingIsDeterministic) {
  ScratchDir dir;
  const std::string text = training_text();
  Tokenizer::train(text, 500).save(dir.file("a.json"));
  Tokenizer::train(text, 500).save(dir.file("b.json"));
  EXPECT_EQ(testing::read_bytes(dir.file("a.json")), testing::read_bytes(dir.file("b.json")));
}

// Brute-force BPE: recount every pair each step; highest count, then smallest (left, right).
std::vector<std::string> reference_bpe(const std::string& text, int64_t vocab_size) {
  std::map<std::string, int64_t> piece_counts;
  for (auto piece : pretokenize(text)) ++piece_counts[std::string(piece)];
  std::vector<std::pair<std::vector<int32_t>, int64_t>> words;
  for (const auto& [piece, count] : piece_counts) {
    std::vector<int32_t> symbols;
    for (char c : piece) symbols.push_back(static_cast<uint8_t>(c));
    words.emplace_back(symbols, count);
  }
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  while (static_cast<int64_t>(tokens.size()) < vocab_size - 1) {
    std::map<std::pair<int32_t, int32_t>, int64_t> counts;
    for (const auto& [s, c] : words) {
      for (size_t k = 0; k + 1 < s.size(); ++k) counts[{s[k], s[k + 1]}] += c;
    }
    if (counts.empty()) break;
    auto best = counts.begin();  // map order = smallest pair first among equal counts
    for (auto it = counts.begin(); it != counts.end(); ++it) {
      if (it->second > best->second) best = it;
    }
    const auto [left, right] = best->first;
    const std::string bytes =
        tokens[static_cast<size_t>(left)] + tokens[static_cast<size_t>(right)];
    auto found = std::find(tokens.begin(), tokens.end(), bytes);
    const auto merged = static_cast<int32_t>(found - tokens.begin());
    if (found == tokens.end()) tokens.push_back(bytes);
    for (auto& [s, c] : words) {
      std::vector<int32_t> out;
      for (size_t k = 0; k < s.size(); ++k) {
        if (k + 1 < s.size() && s[k] == left && s[k + 1] == right) {
          out.push_back(merged);
          ++k;
        } else {
          out.push_back(s[k]);
        }
      }
      s = out;
    }
  }
  return tokens;
}

TEST(Tokenizer, TrainingMatchesBruteForceReference) {
  const std::string text = std::string(kText) + kText + "aaaa aaa aa a abab ababab";
  const int64_t vocab = 420;
  const std::vector<std::string> expected = reference_bpe(text, vocab);
  const Tokenizer tok = Tokenizer::train(text, vocab);
  ASSERT_EQ(tok.vocab_size(), static_cast<int64_t>(expected.size()) + 1);
  for (size_t id = 0; id < expected.size(); ++id) {
    EXPECT_EQ(tok.token_bytes(static_cast<int32_t>(id)), expected[id]) << "token " << id;
  }
}

TEST(Tokenizer, StopsEarlyWhenPairsRunOut) {
  const Tokenizer tok = Tokenizer::train("ab ab", 1000);
  // Pieces "ab", " ab": merges a+b, then " "+ab -> 258 tokens + EOT.
  EXPECT_EQ(tok.vocab_size(), 259);
  EXPECT_EQ(tok.encode("ab ab"), (std::vector<int32_t>{256, 257}));
}

TEST(Tokenizer, RejectsTinyVocab) {
  try {
    Tokenizer::train("abc", 256);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at least 257"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, SaveLoadGivesIdenticalEncodings) {
  ScratchDir dir;
  const Tokenizer tok = Tokenizer::train(training_text(), 600);
  tok.save(dir.file("tok.json"));
  const Tokenizer loaded = Tokenizer::load(dir.file("tok.json"));
  EXPECT_EQ(loaded.vocab_size(), tok.vocab_size());
  EXPECT_EQ(loaded.eot_id(), tok.eot_id());
  EXPECT_EQ(loaded.num_merges(), tok.num_merges());
  for (const std::string& s :
       {std::string(kText), std::string("brand new text, 🙂 ünïcödé\n\n  x")}) {
    EXPECT_EQ(loaded.encode(s), tok.encode(s));
  }
  // And saving the loaded one reproduces the file byte for byte.
  loaded.save(dir.file("again.json"));
  EXPECT_EQ(testing::read_bytes(dir.file("tok.json")), testing::read_bytes(dir.file("again.json")));
}

// A tokenizer small enough to encode by hand: bytes a b c and space (Ġ), merges by rank
// "a b" (0), "ab c" (1), "Ġ a" (2).
std::string tiny_tokenizer_json(const std::string& merges) {
  return R"({
  "version": "1.0",
  "added_tokens": [{"id": 8, "content": "<|endoftext|>", "special": true}],
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false},
  "decoder": {"type": "ByteLevel"},
  "model": {
    "type": "BPE",
    "vocab": {"a": 0, "b": 1, "c": 2, "Ġ": 3, "ab": 4, "abc": 5, "Ġa": 6, "Ċ": 7, "<|endoftext|>": 8},
    "merges": )" +
         merges + R"(
  }
})";
}

TEST(Tokenizer, LoadsHandMadeTokenizerJson) {
  ScratchDir dir;
  for (const std::string& merges : {std::string(R"(["a b", "ab c", "Ġ a"])"),
                                    std::string(R"([["a", "b"], ["ab", "c"], ["Ġ", "a"]])")}) {
    testing::write_text(dir.file("tiny.json"), tiny_tokenizer_json(merges));
    const Tokenizer tok = Tokenizer::load(dir.file("tiny.json"));
    EXPECT_EQ(tok.vocab_size(), 9);
    EXPECT_EQ(tok.eot_id(), 8);
    // "abc" -> a b c -> (a b has rank 0) ab c -> abc.
    EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{5}));
    // " ab" -> Ġ a b: "a b" (rank 0) beats "Ġ a" (rank 2), leaving Ġ + ab.
    EXPECT_EQ(tok.encode(" ab"), (std::vector<int32_t>{3, 4}));
    // " ac" -> Ġ a c: only "Ġ a" applies.
    EXPECT_EQ(tok.encode(" ac"), (std::vector<int32_t>{6, 2}));
    EXPECT_EQ(tok.encode("cab\n"), (std::vector<int32_t>{2, 4, 7}));
    const std::vector<int32_t> ids = {5, 6, 8, 7};
    EXPECT_EQ(tok.decode(ids), "abc a<|endoftext|>\n");
  }
}

TEST(Tokenizer, EncodingAByteOutsideTheVocabFails) {
  ScratchDir dir;
  testing::write_text(dir.file("tiny.json"), tiny_tokenizer_json(R"(["a b"])"));
  const Tokenizer tok = Tokenizer::load(dir.file("tiny.json"));
  EXPECT_THROW(tok.encode("abz"), Error);
  const std::vector<int32_t> bad = {9};
  EXPECT_THROW(tok.decode(bad), Error);
}

}  // namespace
}  // namespace pentad::data
