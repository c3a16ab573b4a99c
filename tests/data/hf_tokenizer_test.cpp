// Hugging Face tokenizer.json features beyond GPT-2's: added and special tokens, LLaMA-3's
// Split pre-tokenizer, ignore_merges, byte_fallback and unk, save/load of each, and the
// refusals, each naming the file and the field. Ids against the tokenizers and sentencepiece
// libraries themselves: tests/python/tokenizer_ids.py.
#include <gtest/gtest.h>

#include "core/check.h"
#include "data/regex_split.h"
#include "data/tokenizer.h"
#include "test_files.h"

namespace pentad::data {
namespace {

using testing::ScratchDir;

// Bytes a b c, space (Ġ) and z; tokens ab, bc, abc; added tokens after them. `model_extra`
// and `pre` replace the options.
std::string hf_json(const std::string& model_extra, const std::string& merges,
                    const std::string& added = "",
                    const std::string& pre = R"({"type": "ByteLevel"})",
                    const std::string& normalizer = "null") {
  return R"({"added_tokens": [)" + added + R"(], "normalizer": )" + normalizer +
         R"(, "pre_tokenizer": )" + pre + R"(, "model": {"type": "BPE", )" + model_extra +
         R"("vocab": {"a": 0, "b": 1, "c": 2, "Ġ": 3, "ab": 4, "bc": 5, "abc": 6, "z": 7},
          "merges": )" +
         merges + "}}";
}

const char* kSpecials =
    R"({"id": 8, "content": "<|endoftext|>", "special": true},
       {"id": 9, "content": "<|begin_of_text|>", "special": true},
       {"id": 10, "content": "<|eot_id|>", "special": true},
       {"id": 11, "content": "<|eot_id|>x", "special": true},
       {"id": 12, "content": "ca", "special": false})";

Tokenizer load_json(const ScratchDir& dir, const std::string& text) {
  testing::write_text(dir.file("tok.json"), text);
  return Tokenizer::load(dir.file("tok.json"));
}

TEST(HfTokenizer, SpecialTokensOnlyWhenAllowed) {
  ScratchDir dir;
  const Tokenizer tok = load_json(dir, hf_json("", R"(["a b", "b c"])", kSpecials));
  EXPECT_EQ(tok.vocab_size(), 13);
  EXPECT_EQ(tok.eot_id(), 8);
  EXPECT_EQ(tok.bos_id(), 9);
  EXPECT_EQ(tok.special_id("<|eot_id|>"), 10);
  EXPECT_EQ(tok.special_id("ca"), -1);  // an added token, but not special
  EXPECT_EQ(tok.special_id("<|nope|>"), -1);
  const std::string text = "ab<|eot_id|>xab<|endoftext|>";
  // An added token that is not special ("ca") is always split out.
  EXPECT_EQ(tok.encode("abcab"), (std::vector<int32_t>{4, 12, 1}));
  // Allowed: special tokens found leftmost-longest ("<|eot_id|>x" over "<|eot_id|>").
  EXPECT_EQ(tok.encode(text, true), (std::vector<int32_t>{4, 11, 4, 8}));
  // By default they are text, and '<' has no token in this vocabulary.
  EXPECT_THROW(tok.encode(text), Error);
  const std::vector<std::string_view> docs = {text, "b<|endoftext|>"};
  const auto batch = tok.encode_batch(docs, true);
  EXPECT_EQ(batch[0], tok.encode(text, true));
  EXPECT_EQ(batch[1], (std::vector<int32_t>{1, 8}));
  EXPECT_EQ(tok.decode(batch[0]), text);
}

TEST(HfTokenizer, IgnoreMergesTakesWholePiecesFromTheVocab) {
  ScratchDir dir;
  // Merges reach "a bc" for "abc" (b c ranks first, no "a bc" merge); the vocab has "abc".
  const std::string merges = R"(["b c", "a b"])";
  EXPECT_EQ(load_json(dir, hf_json("", merges)).encode("abc"), (std::vector<int32_t>{0, 5}));
  const Tokenizer tok = load_json(dir, hf_json(R"("ignore_merges": true, )", merges));
  EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{6}));
  EXPECT_EQ(tok.encode("abca"), (std::vector<int32_t>{0, 5, 0}));  // not a token: merges
  // Saved and loaded again, the option stays.
  tok.save(dir.file("again.json"));
  EXPECT_EQ(Tokenizer::load(dir.file("again.json")).encode("abc"), (std::vector<int32_t>{6}));
}

TEST(HfTokenizer, ByteFallbackAndUnknownTokens) {
  ScratchDir dir;
  // 'q' (0x71) has no token. byte_fallback spells its stand-in ("q") as <0x71>.
  const std::string with_fallback =
      R"({"added_tokens": [], "pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE",
          "byte_fallback": true, "vocab": {"a": 0, "<0x71>": 1, "<unk>": 2}, "merges": []}})";
  const Tokenizer fb = load_json(dir, with_fallback);
  EXPECT_EQ(fb.encode("aqa"), (std::vector<int32_t>{0, 1, 0}));
  EXPECT_EQ(fb.decode(fb.encode("aqa")), "aqa");
  // unk_token with fuse_unk: a run of unknown bytes is one <unk>; without, one per byte.
  for (const bool fuse : {true, false}) {
    const std::string json = R"({"pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE",
        "unk_token": "<unk>", "fuse_unk": )" +
                             std::string(fuse ? "true" : "false") +
                             R"(, "vocab": {"a": 0, "<unk>": 1}, "merges": []}})";
    const Tokenizer tok = load_json(dir, json);
    EXPECT_EQ(tok.encode("aqqa"),
              fuse ? (std::vector<int32_t>{0, 1, 0}) : (std::vector<int32_t>{0, 1, 1, 0}));
  }
}

// LLaMA-3's regex: digits in threes, letters with one leading non-letter, contractions in
// any case, newlines kept with the punctuation before them.
TEST(HfTokenizer, Llama3SplitPattern) {
  const RegexSplitter llama3(kLlama3Pattern, "test");
  auto scratch = llama3.make_scratch();
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"Hello 1234567 WORLD'S", {"Hello", " ", "123", "456", "7", " WORLD", "'S"}},
      {"a.\n\nb", {"a", ".\n\n", "b"}},
      {"x  \n y", {"x", "  \n", " y"}},
      {"(日本)", {"(日本", ")"}},
      {"", {}},
  };
  for (const auto& [text, expected] : cases) {
    std::vector<std::string_view> pieces;
    llama3.split(text, *scratch, pieces);
    EXPECT_EQ(std::vector<std::string>(pieces.begin(), pieces.end()), expected) << text;
  }
  // Bytes that are not UTF-8 are pieces of their own; the stretches around them still split.
  std::vector<std::string_view> pieces;
  llama3.split("ab\xff cd", *scratch, pieces);
  EXPECT_EQ(std::vector<std::string>(pieces.begin(), pieces.end()),
            (std::vector<std::string>{"ab", "\xff", " cd"}));
}

TEST(HfTokenizer, SplitSequenceSavesAndLoads) {
  ScratchDir dir;
  const std::string pre = R"({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "a|[^a]+"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]})";
  const Tokenizer tok = load_json(dir, hf_json("", R"(["a b", "b c", "ab c"])", "", pre));
  EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{0, 5}));  // "a" | "bc"
  const Tokenizer copy = tok;                                  // copies keep their own caches
  tok.save(dir.file("again.json"));
  const Tokenizer again = Tokenizer::load(dir.file("again.json"));
  EXPECT_EQ(again.encode("abcab"), copy.encode("abcab"));
}

TEST(HfTokenizer, RefusalsNameTheFileAndTheField) {
  struct Case {
    std::string name, json;
    std::vector<std::string> expected;
  };
  const std::string byte_level = R"({"type": "ByteLevel"})";
  auto split = [](const std::string& fields) {
    return R"({"type": "Sequence", "pretokenizers": [{"type": "Split", )" + fields +
           R"(}, {"type": "ByteLevel", "use_regex": false}]})";
  };
  const std::vector<Case> cases = {
      {"normalizer",
       hf_json("", "[]", "", byte_level, R"({"type": "NFC"})"),
       {"normalizer", "not supported"}},
      {"dropout", hf_json(R"("dropout": 0.1, )", "[]"), {"model.dropout"}},
      {"subword prefix",
       hf_json(R"("continuing_subword_prefix": "##", )", "[]"),
       {"model.continuing_subword_prefix"}},
      {"ignore_merges not a flag",
       hf_json(R"("ignore_merges": "yes", )", "[]"),
       {"model.ignore_merges must be true or false"}},
      {"unk_token unknown",
       hf_json(R"("unk_token": "<unk>", )", "[]"),
       {"model.unk_token \"<unk>\" is not in the vocab"}},
      {"lstrip",
       hf_json("", "[]", R"({"id": 8, "content": "<m>", "lstrip": true})"),
       {"added_tokens[0].lstrip = true"}},
      {"split behavior",
       hf_json("", "[]", "", split(R"("pattern": {"Regex": "a"}, "behavior": "Removed")")),
       {"pre_tokenizer.pretokenizers[0].behavior is \"Removed\"", "Isolated"}},
      {"split string pattern",
       hf_json("", "[]", "", split(R"("pattern": {"String": "a"}, "behavior": "Isolated")")),
       {"pre_tokenizer.pretokenizers[0].pattern"}},
      {"bad regex",
       hf_json("", "[]", "", split(R"("pattern": {"Regex": "(a"}, "behavior": "Isolated")")),
       {"pre_tokenizer Split 0", "does not compile with PCRE2"}},
      {"digits pre-tokenizer",
       hf_json("", "[]", "",
               R"({"type": "Sequence", "pretokenizers": [{"type": "Digits"},
                   {"type": "ByteLevel"}]})"),
       {"pre_tokenizer.pretokenizers[0]", "Digits", "supported: Split(Regex)"}},
      {"not json, not sentencepiece", "\x0a\x05junk\x01\x02", {"neither a Hugging Face"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ScratchDir dir;
    try {
      load_json(dir, c.json);
      ADD_FAILURE() << c.name << ": no error";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("tok.json"), std::string::npos) << message;
      for (const auto& want : c.expected)
        EXPECT_NE(message.find(want), std::string::npos)
            << c.name << ": \"" << message << "\" lacks \"" << want << "\"";
    }
  }
}

}  // namespace
}  // namespace pentad::data
