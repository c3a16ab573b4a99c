// TensorBoard event files (core/tfevents.h): protobuf wire format by hand, table CRC32C.
#include "core/tfevents.h"

#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <system_error>

#include "core/check.h"

namespace pentad {
namespace {

static_assert(std::endian::native == std::endian::little,
              "TFRecord and protobuf fixed-width fields are little-endian; so is every target");

// The reflected CRC-32C table: entry b is the CRC of the byte b alone.
constexpr std::array<uint32_t, 256> kCrc32cTable = [] {
  std::array<uint32_t, 256> table{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (crc & 1 ? 0x82F63B78u : 0u);
    table[b] = crc;
  }
  return table;
}();

// Protobuf wire types (https://protobuf.dev/programming-guides/encoding/).
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}

void put_key(std::string& out, uint32_t field, WireType type) {
  put_varint(out, (uint64_t(field) << 3) | type);
}

template <typename T>
void put_fixed(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Event's fields (tensorboard/compat/proto/event.proto): wall_time 1 (double), step 2 (int64),
// file_version 3 (string), summary 5 (Summary), session_log 7 (SessionLog).
std::string event_head(double wall_time_s, int64_t step) {
  std::string event;
  put_key(event, 1, kFixed64);
  put_fixed(event, wall_time_s);
  if (step != 0) {  // proto3: a zero int64 is left out
    put_key(event, 2, kVarint);
    put_varint(event, uint64_t(step));
  }
  return event;
}

}  // namespace

uint32_t crc32c(std::string_view bytes, uint32_t crc) {
  crc = ~crc;
  for (const char c : bytes) crc = kCrc32cTable[(crc ^ uint8_t(c)) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view payload) {
  std::string record;
  put_fixed(record, uint64_t(payload.size()));
  put_fixed(record, masked_crc32c(record));
  record.append(payload);
  put_fixed(record, masked_crc32c(payload));
  return record;
}

std::string file_version_event(double wall_time_s) {
  std::string event = event_head(wall_time_s, 0);
  put_bytes(event, 3, "brain.Event:2");
  return event;
}

std::string scalars_event(double wall_time_s, int64_t step, const Scalars& values) {
  // Summary: repeated Value value = 1; Value: tag 1 (string), simple_value 2 (float).
  std::string summary;
  for (const auto& [tag, value] : values) {
    std::string v;
    put_bytes(v, 1, tag);
    put_key(v, 2, kFixed32);
    put_fixed(v, value);
    put_bytes(summary, 1, v);
  }
  std::string event = event_head(wall_time_s, step);
  put_bytes(event, 5, summary);
  return event;
}

std::string session_start_event(double wall_time_s, int64_t step) {
  std::string session_log;  // SessionLog: status 1 (enum, START = 1)
  put_key(session_log, 1, kVarint);
  put_varint(session_log, 1);
  std::string event = event_head(wall_time_s, step);
  put_bytes(event, 7, session_log);
  return event;
}

namespace {

double wall_seconds() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return double(now.tv_sec) + 1e-9 * double(now.tv_nsec);
}

}  // namespace

EventFileWriter::EventFileWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("cannot create the TensorBoard directory {}: {}", dir, ec.message());
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const std::string base = fmt::format("{}/events.out.tfevents.{:010d}.{}", dir,
                                       static_cast<long long>(std::time(nullptr)), host);
  // A second run (a resume) in the same second on the same host gets its own file: "x"
  // opens only a file that does not exist yet.
  for (int n = 0; !file_ && n < 1000; ++n) {
    path_ = n == 0 ? base : fmt::format("{}.{}", base, n);
    file_ = std::fopen(path_.c_str(), "wbx");
    if (!file_ && errno != EEXIST) break;
  }
  if (!file_)
    fail("cannot write the TensorBoard event file {}: {} (train.tensorboard = false turns it off)",
         path_, std::strerror(errno));
  write(file_version_event(wall_seconds()));
}

EventFileWriter::~EventFileWriter() {
  if (file_) std::fclose(file_);
}

void EventFileWriter::add_scalars(int64_t step, const Scalars& values) {
  write(scalars_event(wall_seconds(), step, values));
}

void EventFileWriter::add_session_start(int64_t step) {
  write(session_start_event(wall_seconds(), step));
}

void EventFileWriter::write(const std::string& event) {
  const std::string record = tfrecord(event);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      std::fflush(file_) != 0)
    fail("cannot write the TensorBoard event file {}: {}", path_, std::strerror(errno));
}

}  // namespace pentad
