// TensorBoard event files (core/tfevents.h): CRC32C against published vectors, and records
// and events byte for byte against the bytes TensorBoard's own Python writer produces (its
// event_pb2 messages and record_writer.RecordWriter, tensorboard 2.21.0).
#include "core/tfevents.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

namespace pentad {
namespace {

std::string tfevents_hex(const std::string& bytes) {
  std::string hex;
  for (const char c : bytes) hex += fmt::format("{:02x}", uint8_t(c));
  return hex;
}

TEST(TfEvents, Crc32cKnownVectors) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);  // the CRC catalogue's check value
  EXPECT_EQ(crc32c(""), 0u);
  // RFC 3720 (iSCSI), appendix B.4.
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string up, down;
  for (int i = 0; i < 32; ++i) up += char(i), down += char(31 - i);
  EXPECT_EQ(crc32c(up), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down), 0x113FDB5Cu);
  EXPECT_EQ(crc32c("56789", crc32c("1234")), crc32c("123456789"));  // continues
}

TEST(TfEvents, MaskedCrcAndRecordMatchTensorBoard) {
  EXPECT_EQ(masked_crc32c("123456789"), 0xc78ab0e5u);
  // RecordWriter(...).write(b"abc")
  EXPECT_EQ(tfevents_hex(tfrecord("abc")), "0300000000000000b099490e6162636e57f121");
}

TEST(TfEvents, EventsMatchTensorBoardProtos) {
  // event_pb2.Event(wall_time=1.5, file_version="brain.Event:2")
  EXPECT_EQ(tfevents_hex(file_version_event(1.5)),
            "09000000000000f83f1a0d627261696e2e4576656e743a32");
  // Event(wall_time=1.5, step=300, summary=Summary(value=[Value(tag="loss",
  // simple_value=2.25), Value(tag="moe_layers/1/tokens_max", simple_value=-0.125)]))
  EXPECT_EQ(tfevents_hex(
                scalars_event(1.5, 300, {{"loss", 2.25f}, {"moe_layers/1/tokens_max", -0.125f}})),
            "09000000000000f83f10ac022a2d0a0b0a046c6f737315000010400a1e0a176d6f655f6c61796572732f31"
            "2f746f6b656e735f6d617815000000be");
  // Event(wall_time=1.5, step=7, session_log=SessionLog(status=START))
  EXPECT_EQ(tfevents_hex(session_start_event(1.5, 7)), "09000000000000f83f10073a020801");
}

TEST(TfEvents, WriterStartsWithFileVersionAndNeverReusesAFile) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "pentad-tfevents";
  std::filesystem::remove_all(dir);
  std::string first_path;
  {
    EventFileWriter first(dir.string());
    first.add_scalars(1, {{"loss", 1.0f}});
    first_path = first.path();
    EventFileWriter second(dir.string());  // same second, same host: a file of its own
    EXPECT_NE(second.path(), first.path());
  }
  EXPECT_NE(first_path.find("/events.out.tfevents."), std::string::npos);
  std::ifstream in(first_path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const std::string version = file_version_event(0.0);  // its length; the time differs
  const std::string first_record = tfrecord(bytes.substr(12, version.size()));
  ASSERT_GE(bytes.size(), first_record.size());
  EXPECT_EQ(bytes.substr(0, first_record.size()), first_record);  // both CRCs hold
  EXPECT_NE(bytes.find("brain.Event:2"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pentad
