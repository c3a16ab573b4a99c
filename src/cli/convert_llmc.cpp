// `pentad ckpt convert --to llmc`: a GPT-2 checkpoint as llm.c's model file (convert.h).
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>
#include <utility>
#include <vector>

#include "cli/checkpoint_params.h"
#include "cli/convert.h"
#include "core/check.h"
#include "core/progress.h"
#include "model/model.h"
#include "model/param_table.h"

namespace pentad::ckpt {

namespace fs = std::filesystem;

namespace {

// llm.c's layer tensors (train_gpt2.c, ParameterTensors) in its order, each made of the
// model table's parameters (model/param_table.h) in the rows' order: qkvw stacks q, k, v
// rows. Its matmul weights are (out, in), pentad's layout.
constexpr std::pair<std::string_view, std::string_view> kLlmcLayer[] = {
    {"ln1w", "norm1.weight"},        // (L, C)
    {"ln1b", "norm1.bias"},          // (L, C)
    {"qkvw", "attn.q.weight"},       // (L, 3C, C)
    {"qkvw", "attn.k.weight"},       //
    {"qkvw", "attn.v.weight"},       //
    {"qkvb", "attn.q.bias"},         // (L, 3C)
    {"qkvb", "attn.k.bias"},         //
    {"qkvb", "attn.v.bias"},         //
    {"attprojw", "attn.o.weight"},   // (L, C, C)
    {"attprojb", "attn.o.bias"},     // (L, C)
    {"ln2w", "norm2.weight"},        // (L, C)
    {"ln2b", "norm2.bias"},          // (L, C)
    {"fcw", "mlp.up.weight"},        // (L, 4C, C)
    {"fcb", "mlp.up.bias"},          // (L, 4C)
    {"fcprojw", "mlp.down.weight"},  // (L, C, 4C)
    {"fcprojb", "mlp.down.bias"},    // (L, C)
};

}  // namespace

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
  const std::vector<ParamDecl> layer = layer_params(m, false);
  for (const ParamDecl& d : layer)
    if (std::find_if(std::begin(kLlmcLayer), std::end(kLlmcLayer),
                     [&](const auto& r) { return d.name == r.second; }) == std::end(kLlmcLayer))
      fail("{}: parameter {} has no place in llm.c's GPT-2 (cli/convert_llmc.cpp)", checkpoint_dir,
           d.name);

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

  std::vector<float> wte = ckpt.get("wte.weight", {V, C});
  wte.resize(static_cast<size_t>(Vp * C), 0.0f);  // (Vp, C): padding rows are zero
  put(wte);
  put(ckpt.get("wpe.weight", {T, C}));  // (maxT, C)
  int64_t values = Vp * C + T * C;
  // The layers' tensors, each kind for all layers in turn, from the model's table.
  for (size_t k = 0; k < std::size(kLlmcLayer);) {
    size_t end = k;  // the rows [k, end) make one llm.c tensor
    while (end < std::size(kLlmcLayer) && kLlmcLayer[end].first == kLlmcLayer[k].first) ++end;
    for (int64_t l = 0; l < L; ++l)
      for (size_t r = k; r < end; ++r)
        for (const ParamDecl& d : layer)
          if (d.name == kLlmcLayer[r].second) {
            const Dims dims = dims_of(d.shape);
            put(ckpt.get(layer_prefix(l) + d.name, dims));
            values += numel(dims);
          }
    k = end;
  }
  put(ckpt.get("norm_f.weight", {C}));  // lnfw (C)
  put(ckpt.get("norm_f.bias", {C}));    // lnfb (C)
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
