#pragma once
// TensorBoard event files: TFRecord framing of `Event` protocol buffers, written by hand.
//
// Why by hand: a scalar event needs five protobuf fields (wall_time, step, file_version,
// summary.value.{tag, simple_value}) and one session_log field, and the framing needs
// CRC32C. libprotobuf would bring a .proto compiler step and a large library for that, and
// Debian's CRC32C libraries are not installed anywhere else in pentad; the encoder and a
// table CRC32C are a few dozen lines, tested against published CRC32C vectors
// (tests/core/tfevents_test.cpp) and read back by TensorBoard's own reader
// (tests/python/tensorboard_events.py).
//
// A record: uint64 length (little-endian), masked CRC32C of those 8 bytes, the bytes,
// masked CRC32C of the bytes.
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pentad {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), continuing from `crc`.
uint32_t crc32c(std::string_view bytes, uint32_t crc = 0);
// TFRecord's mask: rotate right by 15 bits and add 0xa282ead8.
uint32_t masked_crc32c(std::string_view bytes);
// One TFRecord: header, payload, footer.
std::string tfrecord(std::string_view payload);

// Serialized `Event` messages.
std::string file_version_event(double wall_time_s);          // file_version "brain.Event:2"
using Scalars = std::vector<std::pair<std::string, float>>;  // (tag, simple_value)
std::string scalars_event(double wall_time_s, int64_t step, const Scalars& values);
// SessionLog START at `step`: TensorBoard drops the events of earlier files at this step and
// after (what a resumed run trains again).
std::string session_start_event(double wall_time_s, int64_t step);

// Appends events to a new file events.out.tfevents.<seconds>.<host> in `dir` (a suffix .N
// when that name is taken), which begins with the file_version event. Each call writes and
// flushes its record.
class EventFileWriter {
 public:
  explicit EventFileWriter(const std::string& dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  void add_scalars(int64_t step, const Scalars& values);
  void add_session_start(int64_t step);
  const std::string& path() const { return path_; }

 private:
  void write(const std::string& event);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace pentad
