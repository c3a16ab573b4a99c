#include "cli/generate.h"

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "cli/checkpoint_params.h"
#include "cli/command.h"
#include "core/check.h"
#include "core/device_memory.h"
#include "data/corpus.h"
#include "data/tokenizer.h"

namespace pentad::ckpt {
namespace fs = std::filesystem;

namespace {

std::vector<int32_t> parse_prompt_ids(const std::string& text, int64_t vocab) {
  std::vector<int32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || id < 0 || id >= vocab)
      fail("--prompt-ids: '{}' is not a token id in [0, {})", item, vocab);
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// Where and in which precision to run. Checked before anything is read: nothing is read for
// a run that cannot start.
Placement placement_for(const GenerateOptions& o) {
  Placement placement;
  if (o.device == "cuda") {
    if (cuda_device_count() == 0)
      fail(
          "--device cuda: no CUDA device is visible (check the driver and CUDA_VISIBLE_DEVICES, "
          "or generate on the CPU)");
    placement.device = Device::CUDA;
    select_cuda_device(0);
  } else if (o.precision == "bf16") {
    fail("--precision bf16 runs on a GPU only: add --device cuda");
  }
  placement.compute = o.precision == "bf16" ? DType::BF16 : DType::F32;
  return placement;
}

// The tokenizer: --tokenizer, else the one the checkpoint carries (checked against its
// sha256), else, for checkpoints from before they carried one, the recipe's file. With
// --prompt-ids it is optional: without one nothing marks the end of a text.
std::optional<data::Tokenizer> load_tokenizer(const GenerateOptions& o,
                                              const CheckpointParams& ckpt) {
  const ModelConfig& m = ckpt.model();
  const std::string carried = carried_tokenizer(o.checkpoint, ckpt.manifest());
  const std::string recipes = data::run_tokenizer(ckpt.config().data, m.vocab_size);
  const std::string path = !o.tokenizer.empty() ? o.tokenizer
                           : !carried.empty()   ? carried
                                                : recipes;
  const bool needed = !o.prompt.empty() || !o.print_ids;
  std::optional<data::Tokenizer> tokenizer;
  if (needed && path.empty())
    fail(
        "{}: the checkpoint carries no tokenizer and its recipe names none (data.tokenizer); "
        "pass --tokenizer FILE, or --prompt-ids with --print-ids",
        o.checkpoint);
  if (!path.empty() && (needed || fs::exists(path))) {
    if (!fs::exists(path))
      fail("{}: the recipe's tokenizer is missing; pass --tokenizer FILE or --prompt-ids", path);
    tokenizer = data::Tokenizer::load(path);
    if (tokenizer->vocab_size() > m.vocab_size)
      fail("{}: {} tokens, more than the model's model.vocab_size = {}", path,
           tokenizer->vocab_size(), m.vocab_size);
  }
  return tokenizer;
}

// The prompt as token ids, with room left in the model's context for at least one more.
std::vector<int32_t> prompt_tokens(const GenerateOptions& o,
                                   const std::optional<data::Tokenizer>& tokenizer,
                                   const ModelConfig& m) {
  std::vector<int32_t> tokens =
      o.prompt.empty() ? parse_prompt_ids(o.prompt_ids, m.vocab_size) : tokenizer->encode(o.prompt);
  if (tokens.empty()) fail("--prompt: encodes to no tokens");
  if (static_cast<int64_t>(tokens.size()) >= m.max_seq_len)
    fail("the prompt is {} tokens; the model's context (model.max_seq_len) is {}: shorten it",
         tokens.size(), m.max_seq_len);
  return tokens;
}

// Every parameter of the generator, read whole from the checkpoint, whatever its layout.
void load_weights(Generator& gen, CheckpointParams& ckpt) {
  ParamStore& params = gen.params();
  for (const ParamSpec& spec : params.specs()) {
    const Dims dims(spec.global_shape.dims.begin(),
                    spec.global_shape.dims.begin() + spec.global_shape.ndim);
    const std::vector<float> values = ckpt.get(spec.name, dims);
    const Tensor to = params.param(params.find(spec.name));
    PENTAD_CHECK(to.numel() == static_cast<int64_t>(values.size()), "{}: {} values for {}",
                 spec.name, values.size(), to.shape.str());
    copy_bytes(to.data, to.device, values.data(), Device::CPU, to.bytes());
  }
  gen.reset();  // a bf16 model's compute copy follows the loaded weights
}

struct Continuation {
  int64_t made = 0;      // tokens sampled, an end-of-text token included
  bool stopped = false;  // at the end-of-text token
  bool filled = false;   // stopped by the model's context before --max-tokens
  double seconds = 0;    // sampling time alone, for tokens/s
};

// Samples up to --max-tokens tokens onto `tokens` (the prompt), streaming the decoded text to
// stdout as it grows unless --print-ids.
Continuation continue_prompt(Generator& gen, std::vector<int32_t>& tokens,
                             const std::optional<data::Tokenizer>& tokenizer,
                             const GenerateOptions& o) {
  // The end of a text ends the continuation, prompt ids or text alike (--ignore-eos: not).
  const int32_t eot = tokenizer && !o.ignore_eos ? tokenizer->eot_id() : -1;
  std::mt19937_64 rng(o.sampling.seed);
  const size_t prompt_len = tokens.size();
  const auto start = std::chrono::steady_clock::now();
  Continuation c;
  std::string shown;  // the decoded continuation so far: print only what is new
  while (c.made < o.max_tokens && static_cast<int64_t>(tokens.size()) < gen.context()) {
    const std::vector<float> logits = gen.next_logits(tokens);
    const int32_t next = pick_token(logits, o.sampling, rng);
    ++c.made;
    if (next == eot) {
      c.stopped = true;
      break;
    }
    tokens.push_back(next);
    if (o.print_ids) continue;
    const std::span<const int32_t> tail(tokens.data() + prompt_len, tokens.size() - prompt_len);
    const std::string text = tokenizer->decode(tail);
    if (text.size() > shown.size() && text.compare(0, shown.size(), shown) == 0) {
      std::fputs(text.c_str() + shown.size(), stdout);
      std::fflush(stdout);
      shown = text;
    }
  }
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The context is a hard stop: GPT-2's learned positions end there, and a sliding window
  // would change the logits of every kept token (docs/generate.md).
  c.filled = static_cast<int64_t>(tokens.size()) >= gen.context() && c.made < o.max_tokens;
  return c;
}

// Ends stdout's continuation (the ids, with --print-ids) and writes the summary to stderr:
// stdout holds the continuation alone, for pipes and files.
void report(const GenerateOptions& o, const Generator& gen, std::span<const int32_t> generated,
            const Continuation& c) {
  if (o.print_ids) {
    std::string line;
    for (size_t i = 0; i < generated.size(); ++i)
      line += (i > 0 ? "," : "") + std::to_string(generated[i]);
    std::puts(line.c_str());
  } else {
    std::puts("");
  }
  std::fflush(stdout);
  std::fprintf(stderr, "generate: %lld tokens in %.3f s: %.1f tokens/s (%s, %s %s)%s\n",
               static_cast<long long>(c.made), c.seconds,
               c.seconds > 0 ? static_cast<double>(c.made) / c.seconds : 0.0,
               gen.uses_cache() ? "key/value cache" : "no cache: a full forward per token",
               o.device.c_str(), o.precision.c_str(),
               c.stopped ? "; stopped at the end-of-text token" : "");
  if (c.filled)
    std::fprintf(stderr,
                 "generate: stopped after %lld tokens: the sequence filled the model's context "
                 "(model.max_seq_len = %lld)\n",
                 static_cast<long long>(c.made), static_cast<long long>(gen.context()));
}

}  // namespace

void generate(const GenerateOptions& o) {
  check_sampling(o.sampling);
  if (o.max_tokens < 1) fail("--max-tokens {}: must be >= 1", o.max_tokens);
  const Placement placement = placement_for(o);
  if (!fs::exists(fs::path(o.checkpoint) / "manifest.json"))
    fail("{}: not a committed checkpoint (no manifest.json); pass a step-N directory",
         o.checkpoint);
  if (o.prompt.empty() == o.prompt_ids.empty())
    fail("generate needs exactly one of --prompt TEXT and --prompt-ids IDS");
  CheckpointParams ckpt(o.checkpoint);
  const ModelConfig& m = ckpt.model();
  const std::optional<data::Tokenizer> tokenizer = load_tokenizer(o, ckpt);
  std::vector<int32_t> tokens = prompt_tokens(o, tokenizer, m);

  Generator gen(m, !o.no_cache, placement);
  load_weights(gen, ckpt);
  const size_t prompt_len = tokens.size();
  const Continuation c = continue_prompt(gen, tokens, tokenizer, o);
  const std::span<const int32_t> generated(tokens.data() + prompt_len, tokens.size() - prompt_len);
  report(o, gen, generated, c);
}

}  // namespace pentad::ckpt

namespace pentad::cli {

void add_generate_command(Commands& commands) {
  auto& gen = commands.keep<ckpt::GenerateOptions>();
  CLI::App* generate = commands.app().add_subcommand(
      "generate", "Continue a prompt from a checkpoint's weights (docs/generate.md)");
  generate->add_option("checkpoint", gen.checkpoint, "Checkpoint directory (step-N), any layout")
      ->required();
  generate->add_option("--prompt", gen.prompt, "Text to continue");
  generate->add_option("--prompt-ids", gen.prompt_ids,
                       "Comma-separated token ids to continue instead of text");
  generate->add_option("--tokenizer", gen.tokenizer,
                       "tokenizer.json or tokenizer.model to use instead of the one the "
                       "checkpoint carries (or, for older checkpoints, the recipe's)");
  generate->add_flag("--ignore-eos", gen.ignore_eos,
                     "Go on past the end-of-text token, to --max-tokens");
  generate->add_option("--max-tokens", gen.max_tokens, "Most tokens to generate")
      ->capture_default_str();
  generate->add_option("--temperature", gen.sampling.temperature, "0: greedy")
      ->capture_default_str();
  generate->add_option("--top-k", gen.sampling.top_k, "Keep the k most likely tokens (0: all)")
      ->capture_default_str();
  generate->add_option("--top-p", gen.sampling.top_p, "Nucleus mass to keep (1: all)")
      ->capture_default_str();
  generate->add_option("--seed", gen.sampling.seed, "Sampling seed")->capture_default_str();
  generate->add_flag("--print-ids", gen.print_ids,
                     "Print the generated token ids (one comma-separated line) instead of text");
  generate->add_option("--device", gen.device, "Where to run: cpu, or cuda (the first GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  generate->add_option("--precision", gen.precision, "fp32, or bf16 (with --device cuda)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  generate->add_flag("--no-cache", gen.no_cache,
                     "Run the whole training forward for every token instead of decoding from "
                     "a key/value cache (slower; the reference the cache is tested against)");
  commands.add(generate, [&gen](const Job& job) {
    if (job.size > 1) fail("generate runs in one process: start it without mpirun");
    ckpt::generate(gen);
    return 0;
  });
}

}  // namespace pentad::cli
