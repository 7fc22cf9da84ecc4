// Serve(): the request loop, worker threads, dispatch to the Runtime, held runs, and the buffer-lifetime rule.
#include <unistd.h>

#include <csignal>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <typeinfo>
#include <utility>
#include <vector>

#include "convert.h"
#include "framing.h"
#include "held_runs.h"
#include "onnx_light_testee/sdk.h"
#include "reported.h"
#include "testee.pb.h"

namespace onnx_light::testee {
namespace {

namespace pb = ::onnx_light::conformance;
using internal::EscapeInvalidUtf8;
using internal::FromProto;
using internal::RequireUtf8;
using internal::Reports;
using internal::ToProto;

class Server {
 public:
  Server(Runtime& runtime, const ServeOptions& options, int out_fd)
      : runtime_(runtime), options_(options), out_fd_(out_fd) {}

  int Loop() {
    StartWorkers();
    int status = 0;
    std::shared_ptr<pb::Request> shutdown;
    while (true) {
      auto body = std::make_shared<std::string>();
      internal::ReadResult read = internal::ReadFrame(options_.input_fd, options_.max_frame_bytes, body.get());
      if (read.status == internal::ReadStatus::kEnd) break;
      if (read.status == internal::ReadStatus::kOversized) {
        std::fprintf(stderr, "testee: frame of %u bytes exceeds the limit of %u; closing\n", read.length,
                     options_.max_frame_bytes);
        SendError(0, "frame of " + std::to_string(read.length) + " bytes exceeds the limit of " +
                         std::to_string(options_.max_frame_bytes) + " bytes; the session ends");
        status = 2;
        break;
      }
      if (read.status != internal::ReadStatus::kFrame) {
        std::fprintf(stderr, "testee: the input stream ended inside a frame; closing\n");
        status = 2;
        break;
      }
      auto request = std::make_shared<pb::Request>();
      if (!request->ParseFromString(*body)) {
        SendError(0, "a frame of " + std::to_string(body->size()) + " bytes is not a parseable Request");
        continue;
      }
      if (request->op_case() == pb::Request::kShutdown) {
        shutdown = std::move(request);
        break;
      }
      if (request->op_case() == pb::Request::kRun && request->run().hold()) held_.Begin(request->run().state());
      Enqueue(std::move(request));
    }
    held_.ReleaseAll();  // no Hold request will come: parked runs go on, so the workers can finish
    StopWorkers();
    if (shutdown) {
      pb::Response response;
      response.set_id(shutdown->id());
      response.mutable_ok();
      Send(response);
    }
    return broken_ ? 3 : status;
  }

 private:
  // ------------------------------------------------------------------------------ workers
  void StartWorkers() {
    int count = options_.workers < 2 ? 2 : options_.workers;
    for (int i = 0; i < count; ++i) workers_.emplace_back([this] { Work(); });
  }

  void Enqueue(std::shared_ptr<pb::Request> request) {
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      queue_.push_back(std::move(request));
    }
    queue_ready_.notify_one();
  }

  void StopWorkers() {
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      closing_ = true;
    }
    queue_ready_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }

  void Work() {
    while (true) {
      std::shared_ptr<pb::Request> request;
      {
        std::unique_lock<std::mutex> lock(queue_mutex_);
        queue_ready_.wait(lock, [this] { return closing_ || !queue_.empty(); });
        if (queue_.empty()) return;
        request = std::move(queue_.front());
        queue_.pop_front();
      }
      Handle(request);
    }
  }

  // ------------------------------------------------------------------------------ replies
  void Send(const pb::Response& response) {
    std::string bytes;
    if (!response.SerializeToString(&bytes)) {
      pb::Response fallback;
      fallback.set_id(response.id());
      fallback.mutable_error()->set_message("the response could not be serialized");
      fallback.SerializeToString(&bytes);
    }
    std::lock_guard<std::mutex> lock(write_mutex_);
    if (!broken_ && !internal::WriteFrame(out_fd_, bytes)) broken_ = true;
  }

  void SendError(std::uint64_t id, const std::string& message) {
    pb::Response response;
    response.set_id(id);
    response.mutable_error()->set_message(EscapeInvalidUtf8(message));
    Send(response);
  }

  void Handle(const std::shared_ptr<pb::Request>& request) {
    pb::Response response;
    response.set_id(request->id());
    try {
      Dispatch(request, &response);
    } catch (const Rejected& rejected) {
      response.Clear();
      response.set_id(request->id());
      pb::Rejection* out = response.mutable_rejected();
      out->set_code(EscapeInvalidUtf8(rejected.code()));
      out->set_message(EscapeInvalidUtf8(rejected.what()));
      for (const std::string& cause : rejected.causes()) out->add_causes(EscapeInvalidUtf8(cause));
    } catch (const NotSupported& unsupported) {
      response.Clear();
      response.set_id(request->id());
      response.mutable_not_supported()->set_reason(EscapeInvalidUtf8(unsupported.what()));
    } catch (const std::exception& error) {
      response.Clear();
      response.set_id(request->id());
      response.mutable_error()->set_message(EscapeInvalidUtf8(error.what()));
      response.mutable_error()->set_traceback(std::string("C++ exception ") + typeid(error).name() +
                                              " while handling request op " + std::to_string(request->op_case()));
    } catch (...) {
      response.Clear();
      response.set_id(request->id());
      response.mutable_error()->set_message("unknown C++ exception while handling request op " +
                                            std::to_string(request->op_case()));
    }
    Send(response);
  }

  // What a state reported (or received) stays alive until it closes: a buffer_id names one buffer for the
  // whole life of its state, and an address is only an identity while its memory cannot be reused.
  void Keep(StateId state, Reports reports) { reported_.Keep(state, std::move(reports)); }

  // A request's values, with every leaf the runner hands back replaced by the runtime's own buffer where
  // the SDK still holds it unchanged.
  NamedValues Incoming(const google::protobuf::RepeatedPtrField<pb::NamedValue>& values,
                       const std::shared_ptr<const void>& owner) {
    const internal::HandedBack find = [this](std::uint64_t id, const Value& copy) { return reported_.Find(id, copy); };
    return FromProto(values, owner, &find);
  }

  void AnswerHello(pb::HelloResult* out) {
    Hello hello = runtime_.GetHello();
    RequireUtf8(hello.name, "the runtime's name");
    RequireUtf8(hello.version, "the runtime's version");
    for (const std::string& profile : hello.profiles) RequireUtf8(profile, "a profile name");
    for (const OperatorRole& role : hello.operators) {
      RequireUtf8(role.role + role.domain + role.op_type, "an operator role");
    }
    out->set_name(hello.name);
    out->set_version(hello.version);
    for (const std::string& profile : hello.profiles) out->add_profiles(profile);
    out->set_protocol_version(kProtocolVersion);
    for (const OperatorRole& role : hello.operators) {
      pb::OperatorRole* added = out->add_operators();
      added->set_role(role.role);
      added->set_domain(role.domain);
      added->set_op_type(role.op_type);
    }
    // The features the runtime has, and only those: a feature not listed is never used.
    out->set_has_features(true);
    if (runtime_.SupportsHeldRuns()) out->add_features(kHoldFeature);
  }

  void AnswerRun(const std::shared_ptr<pb::Request>& request, pb::Response* response) {
    const pb::Run& body = request->run();
    std::shared_ptr<internal::HeldRunImpl> held = body.hold() ? held_.Find(body.state()) : nullptr;
    struct Finished {  // a Hold request waiting for the park is answered however the run ends
      internal::HeldRunImpl* run;
      ~Finished() {
        if (run) run->Finish();
      }
    } finished{held.get()};
    if (body.hold() && !runtime_.SupportsHeldRuns()) {
      throw NotSupported("this runtime does not hold runs (its hello lists no \"hold\" feature)");
    }
    NamedValues feeds = Incoming(body.feeds(), request);
    NamedValues outputs = runtime_.Run(body.state(), feeds, RunOptions{body.cancelled(), held.get()});
    if (held) held->Finish();
    pb::NamedValues* out = response->mutable_values();
    Reports reports;
    reports.owners.push_back(request);
    ToProto(outputs, out->mutable_values(), true, &reports);
    ToProto(feeds, out->mutable_received(), false, &reports);
    Keep(body.state(), std::move(reports));
  }

  void AnswerHold(const pb::Hold& body, pb::Response* response) {
    std::shared_ptr<internal::HeldRunImpl> held = held_.Find(body.state());
    if (!held) throw Rejected("", "no held run on state " + std::to_string(body.state()));
    if (body.release()) {
      if (body.cancel()) held->RequestCancel();
      held->Release();
    } else if (!held->WaitParkedOrFinished()) {
      throw Rejected("", "the held run ended without parking at a Hold node");
    }
    response->mutable_ok();
  }

  // ------------------------------------------------------------------------------ dispatch
  void Dispatch(const std::shared_ptr<pb::Request>& request, pb::Response* response) {
    const std::shared_ptr<const void> owner = request;  // incoming views point into the request
    switch (request->op_case()) {
      case pb::Request::kHello:
        AnswerHello(response->mutable_hello());
        return;
      case pb::Request::kVerify:
        runtime_.Verify(request->verify().model(), request->verify().base_dir());
        response->mutable_ok();
        return;
      case pb::Request::kDecode: {
        const pb::Decode& body = request->decode();
        Value value = runtime_.Decode(body.model(), body.value_name(), body.base_dir());
        ToProto(value, response->mutable_value()->mutable_value(), true, nullptr);
        return;
      }
      case pb::Request::kReadFields: {
        const pb::ReadFields& body = request->read_fields();
        NamedValues fields = runtime_.ReadFields(body.model(), body.value_name(), body.base_dir());
        ToProto(fields, response->mutable_values()->mutable_values(), true, nullptr);
        return;
      }
      case pb::Request::kRoundtrip:
        response->mutable_model()->set_model(
            runtime_.RoundTrip(request->roundtrip().model(), request->roundtrip().base_dir()));
        return;
      case pb::Request::kOpenState: {
        const pb::OpenState& body = request->open_state();
        NamedValues initial = Incoming(body.initial(), owner);
        StateId state = runtime_.OpenState(body.model(), initial, body.base_dir());
        pb::StateOpened* out = response->mutable_state();
        out->set_state(state);
        Reports reports;
        reports.owners.push_back(owner);
        ToProto(initial, out->mutable_received(), false, &reports);
        Keep(state, std::move(reports));
        return;
      }
      case pb::Request::kRun:
        AnswerRun(request, response);
        return;
      case pb::Request::kHold:
        AnswerHold(request->hold(), response);
        return;
      case pb::Request::kValues: {
        NamedValues current = runtime_.Values(request->values().state());
        Reports reports;
        ToProto(current, response->mutable_values()->mutable_values(), true, &reports);
        Keep(request->values().state(), std::move(reports));
        return;
      }
      case pb::Request::kReset: {
        const pb::Reset& body = request->reset();
        NamedValues initial = Incoming(body.initial(), owner);
        runtime_.Reset(body.state(), initial);
        pb::StateOpened* out = response->mutable_state();
        out->set_state(body.state());
        Reports reports;
        reports.owners.push_back(owner);
        ToProto(initial, out->mutable_received(), false, &reports);
        Keep(body.state(), std::move(reports));
        return;
      }
      case pb::Request::kClose:
        runtime_.Close(request->close().state());
        reported_.Forget(request->close().state());
        held_.Forget(request->close().state());
        response->mutable_ok();
        return;
      case pb::Request::kCounters: {
        std::map<std::string, std::int64_t> counters = runtime_.Counters(request->counters().state());
        pb::CounterValues* out = response->mutable_counters();
        for (const auto& [name, value] : counters) {
          RequireUtf8(name, "a counter name");
          pb::Counter* added = out->add_counters();
          added->set_name(name);
          added->set_value(value);
        }
        return;
      }
      case pb::Request::kExport: {
        const pb::Export& body = request->export_();
        ExportResult result = runtime_.Export(body.model(), body.target(), body.base_dir());
        pb::ModelResult* out = response->mutable_model();
        out->set_model(result.model);
        if (result.feedback) {
          out->set_has_feedback(true);
          for (const auto& [input, output] : *result.feedback) {
            pb::FeedbackPair* pair = out->add_feedback();
            pair->set_input_name(input);
            pair->set_output_name(output);
          }
        }
        return;
      }
      case pb::Request::kRewrite: {
        const pb::Rewrite& body = request->rewrite();
        response->mutable_model()->set_model(runtime_.Rewrite(body.model(), body.rewrite_json(), body.base_dir()));
        return;
      }
      case pb::Request::kShutdown:  // handled by the loop
        response->mutable_ok();
        return;
      case pb::Request::OP_NOT_SET:
        break;
    }
    throw NotSupported("the request carries no operation this testee knows (protocol version " +
                       std::to_string(kProtocolVersion) + ")");
  }

  Runtime& runtime_;
  const ServeOptions options_;
  const int out_fd_;

  std::mutex queue_mutex_;
  std::condition_variable queue_ready_;
  std::deque<std::shared_ptr<pb::Request>> queue_;
  bool closing_ = false;
  std::vector<std::thread> workers_;

  std::mutex write_mutex_;
  bool broken_ = false;

  internal::Reported reported_;
  internal::HeldRuns held_;
};

}  // namespace

int Serve(Runtime& runtime, const ServeOptions& options) {
  std::signal(SIGPIPE, SIG_IGN);  // a vanished runner is a write error, not a signal
  int out_fd = options.output_fd;
  if (options.guard_stdout && out_fd == STDOUT_FILENO) {
    out_fd = ::dup(STDOUT_FILENO);
    if (out_fd < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
      std::perror("testee: cannot take the protocol stream");
      return 3;
    }
  }
  Server server(runtime, options, out_fd);
  return server.Loop();
}

}  // namespace onnx_light::testee
