#pragma once
// Streams documents out of users' input files for `pentad data prepare`: JSONL (one JSON
// object per line, the text under a key, as Megatron's preprocess_data.py reads), fortune
// files (documents between "%" lines) or plain text (one document per file), each
// optionally gzip- or zstd-compressed. Files are read line by line, so a corpus larger than memory
// streams through.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pentad::data {

class CompressedInput;

// Shell-style globs -> files, in argument order, each glob's matches sorted. A pattern
// without wildcards must name an existing file; a glob that matches nothing is an error.
std::vector<std::string> expand_input_globs(const std::vector<std::string>& patterns);

bool is_valid_utf8(std::string_view text);

struct DocumentStreamOptions {
  bool fortune_format = false;  // plain-text files only
  std::string json_key = "text";
  bool skip_bad = false;  // report and skip bad lines instead of failing
};

class DocumentStream {
 public:
  DocumentStream(std::vector<std::string> files, DocumentStreamOptions options);
  ~DocumentStream();
  DocumentStream(const DocumentStream&) = delete;
  DocumentStream& operator=(const DocumentStream&) = delete;

  // Next document into `doc`; false at the end of the last file. Throws (file:line) on a
  // bad JSONL line or invalid UTF-8 unless skip_bad.
  bool next(std::string& doc);
  int64_t bad_documents() const { return bad_documents_; }
  // JSONL lines whose text is "": skipped (no document), counted for the summary.
  int64_t empty_texts() const { return empty_texts_; }
  int64_t files_read() const { return static_cast<int64_t>(file_index_); }
  // Bytes of the input files consumed so far (compressed bytes for compressed files), and
  // their total size on disk: the progress display's fraction done.
  int64_t input_bytes_read() const;
  int64_t input_bytes_total() const { return input_bytes_total_; }

 private:
  bool open_next_file();
  bool read_line(std::string& line);  // without its '\n'; false at end of file
  bool next_jsonl(std::string& doc);
  bool next_fortune(std::string& doc);
  bool next_whole_file(std::string& doc);
  void bad(const std::string& what);  // at the current line
  void bad_at(int64_t line, const std::string& what);

  std::vector<std::string> files_;
  DocumentStreamOptions options_;
  size_t file_index_ = 0;
  std::unique_ptr<CompressedInput> file_;
  bool jsonl_ = false;
  int64_t line_ = 0;
  int64_t bad_documents_ = 0;
  int64_t empty_texts_ = 0;
  int64_t input_bytes_total_ = 0, input_bytes_done_ = 0;  // done: files already closed
  std::string pending_;  // bytes read but not yet consumed as lines
  size_t pending_pos_ = 0;
  bool eof_ = false;
  bool line_had_newline_ = false;
};

}  // namespace pentad::data
