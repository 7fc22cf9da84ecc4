// Dense tensors for the graph executor: dtype names and ONNX element types, reading any numeric tensor
// (strided views included) as doubles, writing doubles back in a dtype, broadcasting shapes, and
// TensorProto constants as values. Kernels compute in double: the state and bindings profiles' models
// use small FLOAT, DOUBLE, INT64 and BOOL tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "onnx-light.pb.h"
#include "onnx_light_testee/sdk.h"

namespace example {

// The NumPy name of an ONNX element type ("" for one this executor has no name for).
std::string DtypeName(int elem_type);

// A numeric tensor's elements in row-major order, as doubles (EXECUTION_FAILED for any other value).
std::vector<double> ReadNumbers(const onnx_light::testee::Value& tensor, const std::string& what);

// A new tensor owning its bytes: `values` converted to `dtype` (row-major).
onnx_light::testee::Value MakeTensor(const std::string& dtype, std::vector<std::int64_t> shape,
                                     const std::vector<double>& values);

// The element count of a shape (EXECUTION_FAILED past the executor's limit).
std::uint64_t ElementCount(const std::vector<std::int64_t>& shape, const std::string& what);

// ONNX multidirectional broadcasting of two shapes (EXECUTION_FAILED when they do not broadcast).
std::vector<std::int64_t> Broadcast(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b,
                                    const std::string& what);

// The index into a tensor of `shape` that element `index` of a broadcast `out` shape reads.
std::uint64_t BroadcastIndex(std::uint64_t index, const std::vector<std::int64_t>& out,
                             const std::vector<std::int64_t>& shape);

// A dense initializer or Constant value (raw_data or its typed field).
onnx_light::testee::Value TensorFromProto(const onnx::TensorProto& tensor, const std::string& path);

// A double as an int64: truncated, saturated at the type's range, 0 for NaN (never an undefined cast).
std::int64_t ToInt64(double value);

// Reading an integer attribute-like input (a shape, axes, split sizes).
std::vector<std::int64_t> ReadIndices(const onnx_light::testee::Value& tensor, const std::string& what);

}  // namespace example
