// `pentad ckpt convert --to llmc`: a GPT-2 checkpoint as llm.c's model file (convert.h).
#include <fmt/format.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "cli/checkpoint_params.h"
#include "cli/convert.h"
#include "core/check.h"
#include "core/progress.h"
#include "model/model.h"

namespace pentad::ckpt {

namespace fs = std::filesystem;

std::string export_llmc(const std::string& checkpoint_dir, const std::string& out_path,
                        bool overwrite) {
  refuse_to_replace(out_path, overwrite);
  CheckpointParams ckpt(checkpoint_dir);
  const ModelConfig& m = ckpt.model();
  const int64_t C = m.d_model, V = m.vocab_size, L = m.n_layer, T = m.max_seq_len;
  const int64_t Vp = (V + 127) / 128 * 128;  // llm.c pads the vocabulary to a multiple of 128
  if (m.family != ModelFamily::GPT2)
    fail("{}: llm.c model files hold GPT-2 only; this is a llama model (use --to hf)",
         checkpoint_dir);
  if (!m.tie_embeddings)
    fail("{}: llm.c's GPT-2 ties the output head to wte; this model has untied embeddings",
         checkpoint_dir);
  if (ffn_dim(m) != 4 * C)
    fail("{}: llm.c's GPT-2 has a 4C MLP; this model has d_ff {}", checkpoint_dir, ffn_dim(m));
  if (m.kv_heads() != m.n_head)
    fail("{}: llm.c's GPT-2 has n_kv_head = n_head; this model has {}", checkpoint_dir,
         m.kv_heads());

  const std::string tmp = out_path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) fail("{}: cannot create ({})", tmp, std::strerror(errno));
  // llm.c's file, after the header: L (12 C^2 + 13 C) + (Vp + T + 2) C floats.
  Progress progress("ckpt convert", (L * (12 * C * C + 13 * C) + (Vp + T + 2) * C) * 4);
  int64_t written = 0;
  auto put = [&](const std::vector<float>& v) {
    out.write(reinterpret_cast<const char*>(v.data()),
              static_cast<std::streamsize>(v.size() * sizeof(float)));
    written += static_cast<int64_t>(v.size() * sizeof(float));
    if (progress.due()) progress.show(written, fmt::format("{} MB written", written >> 20));
  };
  int32_t header[256] = {};
  const int64_t fields[] = {20240326, 3, T, V, L, m.n_head, C, Vp};  // magic, version, ...
  for (size_t i = 0; i < std::size(fields); ++i) {
    if (fields[i] > INT32_MAX)
      fail("{}: {} does not fit llm.c's int32 header", checkpoint_dir, fields[i]);
    header[i] = static_cast<int32_t>(fields[i]);
  }
  out.write(reinterpret_cast<const char*>(header), sizeof(header));

  // llm.c's order (train_gpt2.c, ParameterTensors): each kind for all layers in turn.
  // Its matmul weights are (out, in), pentad's layout; qkvw stacks q, k, v rows.
  int64_t values = 0;
  auto all_layers = [&](const std::vector<std::pair<std::string, Dims>>& parts) {
    for (int64_t l = 0; l < L; ++l)
      for (const auto& [suffix, dims] : parts) {
        put(ckpt.get(fmt::format("layers.{}.{}", l, suffix), dims));
        values += numel(dims);
      }
  };
  std::vector<float> wte = ckpt.get("wte.weight", {V, C});
  wte.resize(static_cast<size_t>(Vp * C), 0.0f);  // (Vp, C): padding rows are zero
  put(wte);
  put(ckpt.get("wpe.weight", {T, C}));  // (maxT, C)
  values += Vp * C + T * C;
  all_layers({{"norm1.weight", {C}}});  // ln1w (L, C)
  all_layers({{"norm1.bias", {C}}});    // ln1b (L, C)
  all_layers({{"attn.q.weight", {C, C}},
              {"attn.k.weight", {C, C}},
              {"attn.v.weight", {C, C}}});  // qkvw (L, 3C, C)
  all_layers({{"attn.q.bias", {C}}, {"attn.k.bias", {C}}, {"attn.v.bias", {C}}});  // qkvb (L, 3C)
  all_layers({{"attn.o.weight", {C, C}}});        // attprojw (L, C, C)
  all_layers({{"attn.o.bias", {C}}});             // attprojb (L, C)
  all_layers({{"norm2.weight", {C}}});            // ln2w (L, C)
  all_layers({{"norm2.bias", {C}}});              // ln2b (L, C)
  all_layers({{"mlp.up.weight", {4 * C, C}}});    // fcw (L, 4C, C)
  all_layers({{"mlp.up.bias", {4 * C}}});         // fcb (L, 4C)
  all_layers({{"mlp.down.weight", {C, 4 * C}}});  // fcprojw (L, C, 4C)
  all_layers({{"mlp.down.bias", {C}}});           // fcprojb (L, C)
  put(ckpt.get("norm_f.weight", {C}));            // lnfw (C)
  put(ckpt.get("norm_f.bias", {C}));              // lnfb (C)
  values += 2 * C;
  out.flush();
  if (!out) fail("{}: write failed ({})", tmp, std::strerror(errno));
  out.close();
  std::error_code ec;
  fs::rename(tmp, out_path, ec);
  if (ec) fail("{}: cannot rename {} into place ({})", out_path, tmp, ec.message());
  return fmt::format(
      "wrote {}: llm.c GPT-2 model v3, {} floats (vocabulary padded {} -> {}), "
      "{} bytes",
      out_path, values, V, Vp, fs::file_size(out_path));
}

}  // namespace pentad::ckpt
