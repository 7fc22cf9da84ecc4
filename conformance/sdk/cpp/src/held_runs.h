// Held runs (protocol 4): the HeldRun a runtime parks on, and the SDK's record of the latest one per state.
//
// The request loop registers a held run when it reads a Run with hold, before any worker runs it, so a
// Hold request (the runner sends it only after the Run) finds this run and not an earlier one.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "onnx_light_testee/sdk.h"

namespace onnx_light::testee::internal {

class HeldRunImpl final : public HeldRun {
 public:
  // Runtime side.
  bool Park() override;
  void OnCancel(std::function<void()> cancel) override;
  bool cancel_requested() const override;

  // SDK side. RequestCancel calls the runtime's callbacks (outside the lock), then Release lets it go on.
  void RequestCancel();
  void Release();
  // The run returned, parked or not: a Hold request waiting for the park is answered.
  void Finish();
  // Blocks until the run parks (true) or returns without parking (false).
  bool WaitParkedOrFinished();

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool parked_ = false, released_ = false, finished_ = false, cancel_requested_ = false;
  std::vector<std::function<void()>> on_cancel_;
};

class HeldRuns {
 public:
  // A new held run for `state`, replacing the previous one.
  std::shared_ptr<HeldRunImpl> Begin(StateId state);
  // The latest held run of `state`, or nullptr.
  std::shared_ptr<HeldRunImpl> Find(StateId state);
  void Forget(StateId state);
  // End of the session: every parked run is released and every waiting Hold request answered.
  void ReleaseAll();

 private:
  std::mutex mutex_;
  std::map<StateId, std::shared_ptr<HeldRunImpl>> runs_;
};

}  // namespace onnx_light::testee::internal
