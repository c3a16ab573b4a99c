// The safetensors format: writing and reading back, the dtypes read as F32, malformed files.
#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "core/check.h"

namespace fs = std::filesystem;
using namespace pentad;
using namespace pentad::ckpt;

namespace {

std::string fresh_dir(const std::string& tag) {
  const fs::path dir =
      fs::temp_directory_path() / ("pentad_safetensors_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A safetensors file from a header text and data bytes, written by hand.
std::string raw_safetensors(const std::string& header, const std::string& data) {
  const uint64_t n = header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header + data;
}

}  // namespace

TEST(Safetensors, WriteReadRoundTrip) {
  const std::string dir = fresh_dir("st");
  const std::string path = dir + "/t.safetensors";
  std::vector<NamedTensor> in = {{"b", {2, 3}, {1, -2, 3.5f, 1e-30f, -0.0f, 7}},
                                 {"a", {4}, {0.25f, 1, 2, 3}},
                                 {"scalar", {}, {42}}};
  write_safetensors(path, in, {{"format", "pt"}});
  std::ifstream f(path, std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);  // header padded to 8 bytes
  SafetensorsFile st(path);
  EXPECT_EQ(st.metadata().at("format"), "pt");
  EXPECT_EQ(st.tensors().size(), 3u);
  for (const NamedTensor& t : in) {
    EXPECT_EQ(st.tensors().at(t.name).dtype, "F32");
    EXPECT_EQ(st.tensors().at(t.name).shape, t.shape);
    std::vector<float> got = st.read(t.name);
    ASSERT_EQ(got.size(), t.data.size());
    EXPECT_EQ(std::memcmp(got.data(), t.data.data(), got.size() * 4), 0) << t.name;
  }
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  fs::remove_all(dir);
}

TEST(Safetensors, ReadsBf16F16F64AsF32) {
  const std::string dir = fresh_dir("st16");
  const std::string path = dir + "/h.safetensors";
  const uint16_t bf16[] = {0x3F80, 0xC020, 0x0000, 0x3E80};  // 1, -2.5, 0, 0.25
  const uint16_t f16[] = {0x3C00, 0xC000, 0x7BFF,
                          0x0001, 0x3800, 0x7C00};  // 1, -2, 65504, 2^-24, 0.5, inf
  const double f64[] = {0.1, -3.0};
  std::string data(reinterpret_cast<const char*>(bf16), sizeof(bf16));
  data += std::string(reinterpret_cast<const char*>(f16), sizeof(f16));
  data += std::string(reinterpret_cast<const char*>(f64), sizeof(f64));
  write_bytes(path, raw_safetensors(R"({"x":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},)"
                                    R"("y":{"dtype":"F16","shape":[6],"data_offsets":[8,20]},)"
                                    R"("z":{"dtype":"F64","shape":[2],"data_offsets":[20,36]}})",
                                    data));
  SafetensorsFile st(path);
  EXPECT_EQ(st.read("x"), (std::vector<float>{1.0f, -2.5f, 0.0f, 0.25f}));
  EXPECT_EQ(st.read("y"), (std::vector<float>{1.0f, -2.0f, 65504.0f, std::ldexp(1.0f, -24), 0.5f,
                                              std::numeric_limits<float>::infinity()}));
  EXPECT_EQ(st.read("z"), (std::vector<float>{0.1f, -3.0f}));
  fs::remove_all(dir);
}

TEST(Safetensors, MalformedFilesNameFileAndProblem) {
  const std::string dir = fresh_dir("stbad");
  const std::string path = dir + "/bad.safetensors";
  auto message = [&](const std::string& bytes) {
    write_bytes(path, bytes);
    return error_of([&] { SafetensorsFile f(path); });
  };
  auto expect = [&](const std::string& msg, const std::string& what) {
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  };
  expect(message("abcd"), "shorter than the 8-byte header length");
  expect(message(raw_safetensors("{}", "").substr(0, 8)), "runs past the end of the file");
  std::string huge(8, '\xff');
  expect(message(huge + "{}"), "runs past the end of the file");
  expect(message(raw_safetensors(R"({"a": {"dtype": )", "")), "header is not valid JSON");
  expect(message(raw_safetensors("[1, 2]", "")), "header is not a JSON object");
  expect(message(raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                                 std::string(4, '\0'))),
         "tensor a: data_offsets [0, 8] out of range: the data section holds 4 bytes");
  expect(message(raw_safetensors(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                                 std::string(8, '\0'))),
         "hold 8 bytes but F32 of shape [3] needs 12");
  expect(message(raw_safetensors(R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})",
                                 std::string(8, '\0'))),
         "tensor a: unknown dtype \"Q7\"");
  expect(
      message(raw_safetensors(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0'))),
      "tensor a: no \"dtype\" string");
  expect(message(raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                 R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                 std::string(8, '\0'))),
         "tensors overlap");
  // A dtype safetensors defines but pentad does not convert: the table opens, reading refuses.
  write_bytes(path, raw_safetensors(R"({"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})",
                                    std::string(8, '\0')));
  SafetensorsFile ok(path);
  expect(error_of([&] { ok.read("ids"); }), "tensor ids has dtype I64");
  fs::remove_all(dir);
}
