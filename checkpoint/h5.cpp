#include "checkpoint/h5.h"

#include <hdf5.h>

#include <cerrno>
#include <cstring>
#include <type_traits>

#include "checkpoint/checksum.h"
#include "core/check.h"

namespace pentad::ckpt::h5 {

static_assert(std::is_same_v<hid_t, int64_t>, "h5.h stores hid_t as int64_t");

namespace {

// HDF5 prints its error stack to stderr by default; we report errors ourselves. The
// setting is per thread in thread-safe builds (the asynchronous saver writes from its own
// thread), so every entry point calls this.
//
// A file whose close failed (its metadata did not fit on a full disk) stays open inside
// HDF5 (1.10), and closing the library at exit then loops or crashes on it. Every file
// pentad opens is closed by pentad, so the library is left to the process's end:
// H5dont_atexit takes effect only before HDF5's first use, and later calls do nothing.
void quiet() {
  H5dont_atexit();
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

// The most specific message on HDF5's error stack (e.g. "truncated file: eof = ..."),
// then clears the stack.
std::string hdf5_detail() {
  std::string detail;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* e, void* out) -> herr_t {
        if (n == 0 && e->desc) *static_cast<std::string*>(out) = e->desc;
        return 0;
      },
      &detail);
  H5Eclear2(H5E_DEFAULT);
  return detail.empty() ? "HDF5 error" : detail;
}

// What a failed HDF5 call that writes says: the system's words for a full disk (HDF5's own
// text spreads the errno over a line of offsets and a timestamp), else HDF5's message.
// The caller sets errno to 0 before the call.
std::string write_failure() {
  const int err = errno;
  if (err != ENOSPC && err != EDQUOT) return hdf5_detail();
  H5Eclear2(H5E_DEFAULT);
  return std::strerror(err);
}

// Owns one HDF5 identifier and closes it with the matching H5?close.
class Id {
 public:
  Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Id() {
    if (id_ >= 0) close_(id_);
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  hid_t release() {
    const hid_t id = id_;
    id_ = -1;
    return id;
  }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

hid_t file_access(bool writing) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  // flock() is unsupported on some parallel file systems, and we never share a file
  // between a writer and a reader (files are written under a temporary name).
  H5Pset_file_locking(fapl, false, true);
  H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);
  // Page-aligned data for large datasets: cheaper copies through the page cache.
  if (writing) H5Pset_alignment(fapl, 64 * 1024, 4096);
  return fapl;
}

void write_attribute(hid_t dataset, const char* name, hid_t file_type, hid_t memory_type,
                     const void* value, hsize_t count /* 0: scalar */) {
  Id space(count ? H5Screate_simple(1, &count, nullptr) : H5Screate(H5S_SCALAR), H5Sclose);
  Id attr(H5Acreate2(dataset, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.ok() || H5Awrite(attr.get(), memory_type, value) < 0)
    fail("cannot write attribute {}: {}", name, hdf5_detail());
}

// Creates the dataset (its space allocated, nothing written) and its attributes; returns
// the data's offset in the file, or -1 when it has none.
int64_t create_shard(hid_t file, hid_t lcpl, hid_t dcpl, const ShardData& shard) {
  const ShardInfo& info = shard.info;
  const int ndim = info.local_shape.ndim;
  hsize_t dims[kMaxDims];
  for (int d = 0; d < ndim; ++d) dims[d] = static_cast<hsize_t>(info.local_shape[d]);
  Id space(ndim ? H5Screate_simple(ndim, dims, nullptr) : H5Screate(H5S_SCALAR), H5Sclose);
  Id dataset(
      H5Dcreate2(file, info.name.c_str(), H5T_IEEE_F32LE, space.get(), lcpl, dcpl, H5P_DEFAULT),
      H5Dclose);
  if (!dataset.ok()) fail("cannot create the dataset: {}", hdf5_detail());
  int64_t offset = -1;
  if (info.local_shape.numel() > 0) {
    const haddr_t at = H5Dget_offset(dataset.get());
    if (at == HADDR_UNDEF) fail("no space was allocated for the data: {}", hdf5_detail());
    offset = static_cast<int64_t>(at);
  }

  int64_t global[kMaxDims];
  for (int d = 0; d < info.global_shape.ndim; ++d) global[d] = info.global_shape[d];
  const int32_t shard_dim = info.shard_dim;
  write_attribute(dataset.get(), "global_shape", H5T_STD_I64LE, H5T_NATIVE_INT64, global,
                  static_cast<hsize_t>(info.global_shape.ndim));
  write_attribute(dataset.get(), "shard_dim", H5T_STD_I32LE, H5T_NATIVE_INT32, &shard_dim, 0);
  write_attribute(dataset.get(), "shard_start", H5T_STD_I64LE, H5T_NATIVE_INT64, &info.shard_start,
                  0);
  if (info.shard_dim2 >= 0) {  // a 2D tensor-parallel block
    const int32_t dim2 = info.shard_dim2;
    write_attribute(dataset.get(), "shard_dim2", H5T_STD_I32LE, H5T_NATIVE_INT32, &dim2, 0);
    write_attribute(dataset.get(), "shard_start2", H5T_STD_I64LE, H5T_NATIVE_INT64,
                    &info.shard_start2, 0);
  }
  if (info.row_start != 0)  // a ZeRO share
    write_attribute(dataset.get(), "row_start", H5T_STD_I64LE, H5T_NATIVE_INT64, &info.row_start,
                    0);
  write_attribute(dataset.get(), checksum_name(kWrittenChecksum), H5T_STD_U64LE, H5T_NATIVE_UINT64,
                  &info.checksum, 0);
  return offset;
}

}  // namespace

std::vector<int64_t> create_file(const std::string& path, const std::string& shown_path,
                                 const std::vector<ShardData>& shards) {
  quiet();
  Id fapl(file_access(true), H5Pclose);
  errno = 0;
  Id file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
  if (!file.ok()) fail("{}: cannot create the file: {}", shown_path, write_failure());

  Id lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), 1);  // "param/x" creates group "param"
  Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);
  H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);  // an offset now, data written later
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);    // every byte is written once, by us
  H5Pset_obj_track_times(dcpl.get(), false);            // same state, same bytes
  std::vector<int64_t> offsets;
  for (const ShardData& shard : shards) {
    try {
      offsets.push_back(create_shard(file.get(), lcpl.get(), dcpl.get(), shard));
    } catch (const Error& e) {
      fail("{}: tensor {}: {}", shown_path, shard.info.name, e.what());
    }
  }
  // Closing writes the metadata; the caller writes the data.
  errno = 0;
  if (H5Fclose(file.release()) < 0)
    fail("{}: cannot write HDF5's metadata: {}", shown_path, write_failure());
  return offsets;
}

File::File(const std::string& path) : path_(path) {
  quiet();
  Id fapl(file_access(false), H5Pclose);
  id_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get());
  if (id_ < 0) fail("{}: cannot open the rank file: {}", path, hdf5_detail());
}

File::~File() {
  if (id_ >= 0) H5Fclose(id_);
}

int64_t File::open_dataset(const std::string& name, const Box& stored) {
  quiet();
  if (H5Lexists(id_, name.c_str(), H5P_DEFAULT) <= 0) {  // false for "param/x" without "param"
    H5Eclear2(H5E_DEFAULT);
    fail("{}: tensor {}: not in the file", path_, name);
  }
  hid_t dataset = H5Dopen2(id_, name.c_str(), H5P_DEFAULT);
  if (dataset < 0) fail("{}: tensor {}: cannot open it: {}", path_, name, hdf5_detail());
  Id guard(dataset, H5Dclose);
  Id type(H5Dget_type(dataset), H5Tclose);
  if (!type.ok() || H5Tequal(type.get(), H5T_IEEE_F32LE) <= 0)
    fail("{}: tensor {}: not stored as little-endian f32", path_, name);
  Id space(H5Dget_space(dataset), H5Sclose);
  hsize_t dims[kMaxDims] = {};
  const int ndim = space.ok() ? H5Sget_simple_extent_ndims(space.get()) : -1;
  bool same = ndim == stored.ndim;
  if (same) H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  for (int d = 0; same && d < ndim; ++d) same = static_cast<int64_t>(dims[d]) == stored.extent(d);
  if (!same) {
    H5Eclear2(H5E_DEFAULT);
    fail("{}: tensor {}: the file's dataset does not have the shape the manifest lists", path_,
         name);
  }
  return guard.release();
}

void File::read(const std::string& name, const Shape& shape, float* dst) {
  const Box all = whole_box(shape);
  read_region(name, all, all, dst, all);
}

void File::read_region(const std::string& name, const Box& stored, const Box& region, float* dst,
                       const Box& dst_box) {
  Id dataset(open_dataset(name, stored), H5Dclose);
  if (region.numel() == 0) return;
  herr_t status;
  if (region == stored && region == dst_box) {
    status = H5Dread(dataset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst);
  } else {
    // The same region selected twice: in the file's dataspace (relative to the stored
    // shard) and in the destination's (relative to dst_box).
    const int ndim = region.ndim;
    hsize_t count[kMaxDims], file_at[kMaxDims], dst_dims[kMaxDims], dst_at[kMaxDims];
    for (int d = 0; d < ndim; ++d) {
      count[d] = static_cast<hsize_t>(region.extent(d));
      file_at[d] = static_cast<hsize_t>(region.begin(d) - stored.begin(d));
      dst_dims[d] = static_cast<hsize_t>(dst_box.extent(d));
      dst_at[d] = static_cast<hsize_t>(region.begin(d) - dst_box.begin(d));
    }
    Id file_space(H5Dget_space(dataset.get()), H5Sclose);
    Id memory_space(H5Screate_simple(ndim, dst_dims, nullptr), H5Sclose);
    if (!file_space.ok() || !memory_space.ok() ||
        H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, file_at, nullptr, count, nullptr) <
            0 ||
        H5Sselect_hyperslab(memory_space.get(), H5S_SELECT_SET, dst_at, nullptr, count, nullptr) <
            0)
      fail("{}: tensor {}: cannot select the region: {}", path_, name, hdf5_detail());
    status = H5Dread(dataset.get(), H5T_NATIVE_FLOAT, memory_space.get(), file_space.get(),
                     H5P_DEFAULT, dst);
  }
  if (status < 0) fail("{}: tensor {}: cannot read it: {}", path_, name, hdf5_detail());
}

int64_t data_offset(const std::string& path, const std::string& name) {
  quiet();
  Id fapl(file_access(false), H5Pclose);
  Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
  if (!file.ok()) fail("{}: cannot open the rank file: {}", path, hdf5_detail());
  Id dataset(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
  const haddr_t offset = dataset.ok() ? H5Dget_offset(dataset.get()) : HADDR_UNDEF;
  if (offset == HADDR_UNDEF) fail("{}: tensor {}: no data offset: {}", path, name, hdf5_detail());
  return static_cast<int64_t>(offset);
}

}  // namespace pentad::ckpt::h5
