// DistributedDataParallel::unscaleGradients (declared in ddp.h; the GradScaler side in scaled_gradients.h).
#include "cyxwiz/ddp/scaled_gradients.h"

#include "cyxwiz/comm/collectives.h"
#include "cyxwiz/comm/exchange.h"
#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"
#include "cyxwiz/device/ops16.h"

namespace cyxwiz::ddp {

bool DistributedDataParallel::unscaleGradients(float factor) {
  checkModelUnchanged("unscale_gradients");
  launchStale(false);
  waitAll();  // every bucket averaged (a reduce-scattered one in this rank's part)
  const Device device = model_->device();
  bool finite = true;
  std::vector<ops::FloatSpan> spans;  // on a GPU: one kernel per bucket, one flag read back for all
  for (Bucket& b : buckets_->buckets()) {
    const auto elements = static_cast<size_t>(b.storage.numel());
    const auto first = b.partial ? static_cast<int64_t>(comm::partBegin(elements, worldSize(), rank())) : 0;
    const auto last = b.partial ? static_cast<int64_t>(comm::partBegin(elements, worldSize(), rank() + 1))
                                : static_cast<int64_t>(elements);
    if (device.type == DeviceType::CUDA) {
      spans.push_back({b.storage.deviceData<float>() + first, last - first});
    } else {
      finite = nn::unscaleInPlace(b.storage.data<float>() + first, last - first, factor) && finite;
    }
  }
  if (device.type == DeviceType::CUDA) finite = ops::unscaleOnDevice(device.index, spans, factor);
  if (worldSize() > 1) finite = comm::allReduceSum(*backend_, {finite ? 0.0 : 1.0})[0] == 0.0;
  return finite;
}

}  // namespace cyxwiz::ddp
