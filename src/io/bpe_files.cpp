// Text files to llm.c token files with GPT-2's BPE, on several threads, and back
// (docs/data.md, "GPT-2 byte-level BPE").
//
// The calling thread reads each file in blocks, cuts it into jobs at places where the
// pre-tokeniser's pieces do not change (gpt2_cut), hands the jobs to the encoding
// threads and writes their ids in file order as they finish. The jobs in flight are
// bounded, so memory stays a few blocks per thread whatever the size of the input.

#include "cubelm/io/bpe.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/io/tokens.hpp"
#include "token_format.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <ostream>
#include <thread>

namespace cubelm::io {

using namespace detail;

namespace {

using Clock = std::chrono::steady_clock;

// A stretch of one file to encode, or a separator (done from the start).
struct Job {
  std::string text;
  std::uint64_t bytes = 0;
  std::vector<std::int32_t> ids;
  bool done = false;
};

// The encoding threads: each takes the oldest waiting job and encodes it with an
// encoder (and cache) of its own.
class Workers {
public:
  Workers(const Bpe& bpe, int threads) {
    for (int k = 0; k < threads; ++k)
      threads_.emplace_back([this, bpe] { run(bpe); });
  }
  ~Workers() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      todo_.clear();
    }
    work_.notify_all();
    for (std::thread& t : threads_)
      t.join();
  }
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  void submit(Job* job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      todo_.push_back(job);
    }
    work_.notify_one();
  }
  // True once `job` is done; false when `timeout` passed first. Rethrows what a thread
  // raised.
  bool wait(const Job* job, Clock::duration timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait_for(lock, timeout, [&] { return job->done || error_; });
    if (error_)
      std::rethrow_exception(error_);
    return job->done;
  }
  std::uint64_t bytes_done() {
    std::lock_guard<std::mutex> lock(mutex_);
    return bytes_done_;
  }

private:
  void run(const Bpe& bpe) {
    BpeEncoder encoder(bpe);
    for (;;) {
      Job* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_.wait(lock, [&] { return stop_ || !todo_.empty(); });
        if (stop_)
          return;
        job = todo_.front();
        todo_.pop_front();
      }
      std::exception_ptr error;
      try {
        encoder.encode(job->text, job->ids);
      } catch (...) {
        error = std::current_exception();
      }
      std::string().swap(job->text);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        job->done = true;
        bytes_done_ += job->bytes;
        if (error && !error_)
          error_ = error;
      }
      done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_, done_;
  std::deque<Job*> todo_;
  bool stop_ = false;
  std::exception_ptr error_;
  std::uint64_t bytes_done_ = 0;
  std::vector<std::thread> threads_;
};

} // namespace

BpeRunResult bpe_text_to_llmc(const Bpe& bpe, const std::vector<std::string>& inputs,
                              const std::string& output, const BpeRunOptions& options) {
  if (bpe.id_limit() - 1 > 65535)
    fail(bpe.source(), "its ids go up to " + str(bpe.id_limit() - 1) +
                           ": an llm.c token file stores uint16 tokens, in [0, 65535]");
  const std::uint64_t total = input_text_bytes(inputs, output);
  const int threads = std::max(1, options.threads);
  const std::size_t chunk = std::max<std::size_t>(options.chunk_bytes, 1);
  const auto interval = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::max(options.progress_seconds, 0.01)));
  const Clock::time_point start = Clock::now();
  Clock::time_point last_report = start;
  const auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };

  OutFile out(output);
  std::int64_t tokens = 0;
  try {
    out.write(llmc_header(0));
    // Declared before the workers, which hold pointers into it: they stop first.
    std::deque<std::unique_ptr<Job>> pending;
    Workers workers(bpe, threads);
    const std::size_t most_pending = 2 * static_cast<std::size_t>(threads) + 2;
    std::vector<unsigned char> buf;

    const auto report = [&] {
      if (!options.progress || Clock::now() - last_report < interval)
        return;
      last_report = Clock::now();
      options.progress(BpeProgress{workers.bytes_done(), total, seconds()});
    };
    const auto write_oldest = [&] {
      const Job* job = pending.front().get();
      while (!workers.wait(job, interval))
        report();
      report();
      tokens += static_cast<std::int64_t>(job->ids.size());
      if (tokens > std::numeric_limits<std::int32_t>::max())
        fail(output, "more than 2^31 - 1 tokens: an llm.c header counts at most 2^31 - 1 "
                     "tokens (int32); convert the inputs into several files");
      buf.clear();
      for (std::int32_t id : job->ids)
        put_le(buf, static_cast<std::uint32_t>(id), 2);
      out.write(buf);
      pending.pop_front();
    };
    const auto add = [&](std::unique_ptr<Job> job) {
      if (pending.size() >= most_pending)
        write_oldest();
      Job* raw = job.get();
      pending.push_back(std::move(job));
      if (!raw->done)
        workers.submit(raw);
    };
    const auto add_text = [&](std::string text) {
      auto job = std::make_unique<Job>();
      job->bytes = text.size();
      job->text = std::move(text);
      add(std::move(job));
    };

    for (std::size_t f = 0; f < inputs.size(); ++f) {
      if (f > 0) {
        auto separator = std::make_unique<Job>();
        separator->ids.push_back(bpe.end_of_text());
        separator->done = true;
        add(std::move(separator));
      }
      InFile in(inputs[f], "text file");
      std::string carry; // read, not yet handed out
      std::size_t searched = 0;
      for (std::uint64_t offset = 0; offset < in.size();) {
        const auto block =
            static_cast<std::size_t>(std::min<std::uint64_t>(chunk, in.size() - offset));
        const std::size_t had = carry.size();
        carry.resize(had + block);
        in.read(offset, carry.data() + had, block);
        offset += block;
        if (offset == in.size())
          break;
        // Cut in the last quarter of what is read; where no cut is found there (text
        // without white space), read on and look further.
        const std::size_t cut = gpt2_cut(carry, std::max(searched, carry.size() * 3 / 4));
        if (cut == carry.size()) {
          searched = carry.size();
          continue;
        }
        add_text(carry.substr(0, cut));
        carry.erase(0, cut);
        searched = 0;
      }
      if (!carry.empty())
        add_text(std::move(carry));
    }
    while (!pending.empty())
      write_oldest();
    out.rewrite(0, llmc_header(tokens));
    out.close();
  } catch (...) {
    std::error_code ec;
    fs::remove(output, ec); // a partial file would read as a shorter corpus
    throw;
  }
  return BpeRunResult{tokens, total, seconds()};
}

std::int64_t llmc_to_text(const std::string& path, const Bpe* bpe, std::ostream& out) {
  const std::vector<std::int32_t> ids = read_llmc(path, bpe != nullptr ? 65536 : 256);
  std::string text;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (bpe == nullptr) {
      text += static_cast<char>(ids[i]);
    } else {
      if (!bpe->has(ids[i]))
        fail(path, "token " + ustr(i) + " is " + str(ids[i]) + ", which names no token of " +
                       bpe->source() + " (ids 0.." + str(bpe->id_limit() - 1) +
                       "): decode a file with the vocabulary that wrote it");
      text += bpe->bytes_of(ids[i]);
    }
    if (text.size() >= (std::size_t{1} << 20)) {
      out.write(text.data(), static_cast<std::streamsize>(text.size()));
      text.clear();
    }
  }
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.flush();
  if (!out)
    fail(path, "writing its text failed (is the disk full?)");
  return static_cast<std::int64_t>(ids.size());
}

} // namespace cubelm::io
