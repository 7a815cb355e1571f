#include "cyxwiz/ddp/rows.h"

#include <cstring>

#include "cyxwiz/common/error.h"

namespace cyxwiz::ddp {

namespace {

size_t rowBytes(const Tensor& t) { return t.dim() == 0 || t.size(0) == 0 ? 0 : t.nbytes() / static_cast<size_t>(t.size(0)); }

}  // namespace

Tensor gatherRows(const Tensor& t, const std::vector<int64_t>& indices) {
  Shape shape = t.shape();
  const int64_t rows = shape.at(0);
  shape[0] = static_cast<int64_t>(indices.size());
  Tensor out = Tensor::empty(shape, t.dtype());
  const size_t bytes = rowBytes(t);
  const auto* src = static_cast<const uint8_t*>(t.rawData());
  auto* dst = static_cast<uint8_t*>(out.rawData());
  for (size_t k = 0; k < indices.size(); ++k) {
    CYX_CHECK(indices[k] >= 0 && indices[k] < rows, "row index ", indices[k], " out of range for ", rows, " rows");
    std::memcpy(dst + k * bytes, src + static_cast<size_t>(indices[k]) * bytes, bytes);
  }
  return out;
}

Tensor rowRange(const Tensor& t, int64_t begin, int64_t end) {
  Shape shape = t.shape();
  shape[0] = end - begin;
  return t.view(begin * static_cast<int64_t>(rowBytes(t) / itemSize(t.dtype())), shape);
}

void checkDataset(const Tensor& X, const Tensor& y, const std::string& who) {
  CYX_CHECK(X.dim() >= 2 && X.dtype() == DType::Float32, who, ": X must be a float32 array of samples, (samples, features) "
            "or (samples, channels, height, width), got ",
            dtypeName(X.dtype()), " ", shapeString(X.shape()));
  CYX_CHECK(y.dim() >= 1 && y.size(0) == X.size(0), who, ": y has ", y.dim() ? y.size(0) : 0, " rows but X has ",
            X.size(0), "; give one target per sample");
  CYX_CHECK(X.size(0) > 0, who, ": the dataset is empty");
}

}  // namespace cyxwiz::ddp
