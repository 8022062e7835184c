// AsyncCheckpointWriter: the background thread of checkpoint.async_save. A save takes its
// snapshot on the trainer's thread (SaveTrainerCheckpointAsync, checkpoint.h) and queues the
// write here; the trainer goes on while the files are written.
//
// Contract:
//   - Writes run one at a time, in the order queued, on one thread the writer owns (started at
//     the first Enqueue).
//   - A failed write makes the writes queued after it fail without running (the PPO critic's
//     checkpoint is queued before the actor's, whose tracker commits the pair: a failed critic
//     write must not be followed by a tracker naming that iteration).
//   - Wait() blocks until nothing is queued or running and returns the first failure since the
//     previous Wait — every failure is returned exactly once, its message naming the iteration
//     directory the write was to publish.
//   - The destructor lets every queued write finish (so a clean shutdown completes the
//     checkpoint), then joins the thread; a failure nobody waited for is logged.
// Thread-safety: Enqueue, busy and Wait may be called from any thread; the write functions run
// on the writer's thread and must not touch anything the caller may change meanwhile (they
// own host copies of what they write).
#ifndef SLIME_TRAIN_CHECKPOINT_WRITER_H_
#define SLIME_TRAIN_CHECKPOINT_WRITER_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "slime/common/status.h"

namespace slime::train {

class AsyncCheckpointWriter {
 public:
  AsyncCheckpointWriter() = default;
  ~AsyncCheckpointWriter();
  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;

  // Queues `write`, which publishes the iteration directory `dir` (named in its error).
  void Enqueue(std::string dir, std::function<Status()> write);

  // Whether a write is queued or running.
  bool busy();

  // Waits for every queued write; the first failure since the previous Wait (OK when none).
  // `write_seconds` (optional): the wall time of the writes that ran since the previous Wait.
  Status Wait(double* write_seconds = nullptr);

 private:
  struct Job {
    std::string dir;
    std::function<Status()> write;
  };
  void Run();

  std::mutex mu_;
  std::condition_variable queued_;  // a job was queued, or stop_
  std::condition_variable idle_;    // a job finished
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Status failure_ ABSL_GUARDED_BY(mu_);
  double seconds_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // started by the first Enqueue (under mu_)
};

}  // namespace slime::train

#endif  // SLIME_TRAIN_CHECKPOINT_WRITER_H_
