// MPI's start and end, and the ranks' agreement on an error (launch/errors.h).
#include "launch/errors.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

namespace pentad::launch {
namespace {

// What the ranks agree on about an error, in one all-reduce (MPI_MAX) of four words: whether
// some rank has none, the largest exit status (0: no rank has an error), and the smallest
// (as its complement) and largest hash of the errors' words.
struct Agreement {
  unsigned long long words[4] = {0, 0, 0, 0};
  Agreement(const std::exception* e, int status) {
    const unsigned long long h = e ? std::hash<std::string>{}(e->what()) : 0;
    words[0] = e ? 0 : 1;
    words[1] = e ? static_cast<unsigned long long>(status) : 0;
    words[2] = e ? ~h : 0;
    words[3] = e ? h : 0;
  }
  int status() const { return int(words[1]); }
  // One error line for the whole job where every rank has the same error.
  bool unanimous() const { return words[0] == 0 && ~words[2] == words[3]; }
  void print(const std::exception* e, int rank, int size) const {
    if (!e) return;
    if (!unanimous())
      cli::print_error(*e, size > 1 ? rank : -1);  // only some ranks: each says which it is
    else if (rank == 0)
      cli::print_error(*e, -1);
  }
};

int agree_at_barrier(const std::exception* e, int status, int rank, int size) {
  Agreement a(e, status);
  MPI_Allreduce(MPI_IN_PLACE, a.words, 4, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  a.print(e, rank, size);
  return a.status();
}

}  // namespace

Mpi::Mpi(int& argc, char**& argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_dup(MPI_COMM_WORLD, &errors);
}

Mpi::~Mpi() {
  MPI_Comm_free(&errors);
  MPI_Finalize();
}

cli::Job Mpi::job() const {
  cli::Job job;
  job.rank = rank;
  job.size = size;
  job.errors = errors;
  job.on_every_rank = [rank = rank, size = size](const std::function<void()>& step) {
    return on_every_rank(rank, size, step);
  };
  return job;
}

int on_every_rank(int rank, int size, const std::function<void()>& step) {
  try {
    step();
  } catch (const std::exception& e) {
    return agree_at_barrier(&e, cli::is_ours(e) ? cli::kRefused : cli::kInternal, rank, size);
  }
  return agree_at_barrier(nullptr, 0, rank, size);
}

int report_error(const std::exception& e, int status, const cli::Job& job,
                 const std::function<void()>& tell, double seconds) {
  Agreement a(&e, status);
  if (job.size > 1) {
    Agreement reduced = a;
    MPI_Request request;
    MPI_Iallreduce(a.words, reduced.words, 4, MPI_UNSIGNED_LONG_LONG, MPI_MAX, job.errors,
                   &request);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    int done = 0;
    while (!done && std::chrono::steady_clock::now() < until) {
      MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    // Not every rank came: some have no error (or have not met theirs yet).
    a.words[0] = done ? reduced.words[0] : 1;
    if (done) std::copy(reduced.words + 1, reduced.words + 4, a.words + 1);
  }
  a.print(&e, job.rank, job.size);
  if (tell) tell();
  if (job.size > 1) MPI_Abort(MPI_COMM_WORLD, status);
  return status;
}

}  // namespace pentad::launch
