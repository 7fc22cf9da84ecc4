#include "held_runs.h"

#include <utility>

namespace onnx_light::testee::internal {

bool HeldRunImpl::Park() {
  std::unique_lock<std::mutex> lock(mutex_);
  parked_ = true;
  changed_.notify_all();
  changed_.wait(lock, [this] { return released_; });
  return cancel_requested_;
}

void HeldRunImpl::OnCancel(std::function<void()> cancel) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!cancel_requested_) {
      on_cancel_.push_back(std::move(cancel));
      return;
    }
  }
  cancel();
}

bool HeldRunImpl::cancel_requested() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cancel_requested_;
}

void HeldRunImpl::RequestCancel() {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancel_requested_ = true;
    callbacks.swap(on_cancel_);
  }
  for (const auto& callback : callbacks) callback();
}

void HeldRunImpl::Release() {
  std::lock_guard<std::mutex> lock(mutex_);
  released_ = true;
  changed_.notify_all();
}

void HeldRunImpl::Finish() {
  std::vector<std::function<void()>> dropped;  // the call returned: nothing is left to cancel
  std::lock_guard<std::mutex> lock(mutex_);
  finished_ = true;
  dropped.swap(on_cancel_);
  changed_.notify_all();
}

bool HeldRunImpl::WaitParkedOrFinished() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return parked_ || finished_; });
  return parked_;
}

std::shared_ptr<HeldRunImpl> HeldRuns::Begin(StateId state) {
  auto run = std::make_shared<HeldRunImpl>();
  std::lock_guard<std::mutex> lock(mutex_);
  runs_[state] = run;
  return run;
}

std::shared_ptr<HeldRunImpl> HeldRuns::Find(StateId state) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = runs_.find(state);
  return found == runs_.end() ? nullptr : found->second;
}

void HeldRuns::Forget(StateId state) {
  std::lock_guard<std::mutex> lock(mutex_);
  runs_.erase(state);
}

void HeldRuns::ReleaseAll() {
  std::map<StateId, std::shared_ptr<HeldRunImpl>> runs;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    runs = runs_;
  }
  for (auto& [state, run] : runs) {
    run->Release();
    run->Finish();
  }
}

}  // namespace onnx_light::testee::internal
