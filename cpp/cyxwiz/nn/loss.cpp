#include "cyxwiz/nn/loss.h"

#include <algorithm>

#include "cyxwiz/common/error.h"
#include "cyxwiz/device/cuda.h"
#include "cyxwiz/nn/module.h"

namespace cyxwiz::nn {

namespace {

// One float64 zero where `output` lives, for the single-batch calls that read their sum back.
Tensor scalarSum(const Tensor& output) { return Tensor::zeros({1}, DType::Float64, output.device()); }

double readScalar(const Tensor& sum) { return sum.to(Device{}).data<double>()[0]; }

}  // namespace

double Loss::forward(const Tensor& output, const Tensor& target) {
  const Tensor t = prepareTarget(output, target, typeName() + ".forward");
  Tensor sum = scalarSum(output);
  addLossSum(output, t, sum, 0);
  return readScalar(sum) / static_cast<double>(terms(output.shape(), t));
}

Tensor Loss::prepareTarget(const Tensor& output, const Tensor& target, const std::string& who) const {
  if (output.dtype() != DType::Float32) {
    throw TypeMismatch(makeString(who, ": expected a float32 output, got ", dtypeName(output.dtype())));
  }
  checkTarget(output.shape(), target, who);
  return targetOnDevice(output, target);
}

Tensor Loss::backward(const Tensor& output, const Tensor& target) {
  return gradient(output, prepareTarget(output, target, typeName() + ".backward"));
}

namespace {

// Flat index -> "row 3" (2-D outputs) or "position (1, 4)" (sequences).
std::string labelPosition(int64_t flat, const Shape& labels) {
  if (labels.size() == 1) return makeString("row ", flat);
  Shape at(labels.size());
  for (size_t d = labels.size(); d-- > 0;) {
    at[d] = flat % labels[d];
    flat /= labels[d];
  }
  return "position " + shapeString(at);
}

}  // namespace

bool checkClassTarget(const Shape& outputShape, const Tensor& target, const std::string& who, IgnoreIndex ignore) {
  CYX_CHECK(outputShape.size() >= 2, who, ": expected output of shape (batch, classes) or (batch, ..., classes), got ",
            shapeString(outputShape));
  const int64_t rows = outputShape[0], classes = outputShape.back();
  CYX_CHECK(rows > 0, who, ": the batch is empty");
  const Shape labels(outputShape.begin(), outputShape.end() - 1);
  if (target.dtype() == DType::Int64 && (target.dim() == 1 || outputShape.size() > 2)) {
    if (target.shape() != labels) {
      if (labels.size() == 1) {
        throw InvalidArgument(makeString(who, ": output has ", rows, " rows but target has ", target.size(0), " labels"));
      }
      throw InvalidArgument(makeString(who, ": an output of shape ", shapeString(outputShape), " takes class indices of shape ",
                                       shapeString(labels), ", got ", shapeString(target.shape())));
    }
    const Tensor host = target.to(Device{});  // labels on a GPU: a small copy, checked here
    const int64_t* t = host.data<int64_t>();
    for (int64_t r = 0; r < host.numel(); ++r) {
      CYX_CHECK((t[r] >= 0 && t[r] < classes) || t[r] == ignore, who, ": target class ", t[r], " at ",
                labelPosition(r, labels), " is out of range for ", classes, " classes (valid: 0..", classes - 1,
                ignore ? makeString(", or ignore_index ", *ignore) : std::string(), ")");
    }
    return true;
  }
  CYX_CHECK(target.dtype() == DType::Float32 && target.shape() == outputShape, who,
            ": target must be class indices of shape ", shapeString(labels), " or rows of shape ", shapeString(outputShape),
            ", got ", dtypeName(target.dtype()), " ", shapeString(target.shape()));
  return false;
}

Tensor targetOnDevice(const Tensor& output, const Tensor& target) { return target.to(output.device()); }

int64_t countTargets(const Tensor& target, IgnoreIndex ignore) {
  if (target.dtype() != DType::Int64) return target.dim() ? target.numel() / target.size(target.dim() - 1) : 0;
  if (!ignore) return target.numel();
  const Tensor host = target.to(Device{});
  const int64_t* t = host.data<int64_t>();
  return static_cast<int64_t>(host.numel() - std::count(t, t + host.numel(), *ignore));
}

void addCorrectCount(const Tensor& output, const Tensor& target, Tensor& sums, int64_t index, IgnoreIndex ignore) {
  const bool indices = target.dtype() == DType::Int64;
  const int64_t classes = output.size(output.dim() - 1), rows = output.numel() / classes;  // every position
  if (output.isCuda()) {
    CYX_CUDA(countCorrect(output.device().index, output.deviceData<float>(), indices ? target.deviceData<int64_t>() : nullptr,
                          indices ? nullptr : target.deviceData<float>(), rows, classes,
                          ignore.value_or(cuda::kNoIgnoreIndex), sums.deviceData<double>() + index));
    return;
  }
  const float* y = output.data<float>();
  int64_t correct = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = y + r * classes;
    int64_t predicted = std::max_element(row, row + classes) - row;
    int64_t truth;
    if (indices) {
      truth = target.data<int64_t>()[r];
      if (truth == ignore) continue;
    } else {
      const float* t = target.data<float>() + r * classes;
      truth = std::max_element(t, t + classes) - t;
    }
    correct += predicted == truth;
  }
  sums.data<double>()[index] += static_cast<double>(correct);
}

int64_t countCorrect(const Tensor& output, const Tensor& target, IgnoreIndex ignore) {
  if (output.dtype() != DType::Float32) throw TypeMismatch(makeString("accuracy: expected float32 output, got ", dtypeName(output.dtype())));
  checkClassTarget(output.shape(), target, "accuracy", ignore);
  Tensor sum = scalarSum(output);
  addCorrectCount(output, targetOnDevice(output, target), sum, 0, ignore);
  return static_cast<int64_t>(readScalar(sum));
}

double accuracy(const Tensor& output, const Tensor& target, IgnoreIndex ignore) {
  // Over the positions that count: NaN when every one is ignored (0 / 0, as torch's mean loss).
  const int64_t correct = countCorrect(output, target, ignore);
  return static_cast<double>(correct) / static_cast<double>(countTargets(target, ignore));
}

}  // namespace cyxwiz::nn
