#include "cubelm/comm/request.hpp"

#include "cubelm/comm/watchdog.hpp"
#include "cubelm/core/error.hpp"

namespace cubelm::comm {

Request::Request(std::unique_ptr<PendingOp> op, std::function<void()> finish, const char* group,
                 const char* what)
    : op_(std::move(op)), finish_(std::move(finish)), group_(group), what_(what) {
  CUBELM_ASSERT(op_ != nullptr, "a Request needs an operation in flight");
}

Request::Request(Request&& other) noexcept
    : op_(std::move(other.op_)), finish_(std::move(other.finish_)), group_(other.group_),
      what_(other.what_) {
  other.finish_ = nullptr;
}

Request& Request::operator=(Request&& other) {
  if (this != &other) {
    wait();
    op_ = std::move(other.op_);
    finish_ = std::move(other.finish_);
    group_ = other.group_;
    what_ = other.what_;
    other.finish_ = nullptr;
  }
  return *this;
}

Request::~Request() {
  wait();
}

bool Request::test() {
  if (op_ == nullptr)
    return true;
  if (!op_->test())
    return false;
  finish();
  return true;
}

void Request::wait() {
  if (op_ == nullptr)
    return;
  {
    const watchdog::Scope waiting(group_, what_);
    op_->wait();
  }
  finish();
}

void Request::finish() {
  // Done before running `finish`: a Request is complete even if copying back throws.
  op_.reset();
  std::function<void()> finish = std::move(finish_);
  finish_ = nullptr;
  if (finish)
    finish();
}

void wait_all(std::vector<Request>& requests) {
  for (Request& r : requests)
    r.wait();
}

bool test_all(std::vector<Request>& requests) {
  bool all = true;
  for (Request& r : requests)
    all = r.test() && all;
  return all;
}

} // namespace cubelm::comm
