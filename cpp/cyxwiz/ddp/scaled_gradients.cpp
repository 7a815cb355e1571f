// DistributedDataParallel::unscaleGradients (declared in ddp.h; the GradScaler side in scaled_gradients.h).
#include "cyxwiz/ddp/scaled_gradients.h"

#include "cyxwiz/comm/collectives.h"
#include "cyxwiz/comm/exchange.h"
#include "cyxwiz/common/error.h"
#include "cyxwiz/common/logging.h"

namespace cyxwiz::ddp {

bool DistributedDataParallel::unscaleGradients(float factor) {
  checkModelUnchanged("unscale_gradients");
  CYX_CHECK(model_->device().type == DeviceType::CPU, rankPrefix(), "GradScaler: the model is on ",
            model_->device().str(), "; loss scaling runs on the CPU only in this version (as autocast does): train "
            "the GPU model in float32");
  launchStale();
  waitAll();  // every bucket averaged (a reduce-scattered one in this rank's part)
  bool finite = true;
  for (Bucket& b : buckets_->buckets()) {
    const auto elements = static_cast<size_t>(b.storage.numel());
    const auto first = b.partial ? static_cast<int64_t>(comm::partBegin(elements, worldSize(), rank())) : 0;
    const auto last = b.partial ? static_cast<int64_t>(comm::partBegin(elements, worldSize(), rank() + 1))
                                : static_cast<int64_t>(elements);
    finite = nn::unscaleInPlace(b.storage.data<float>() + first, last - first, factor) && finite;
  }
  if (worldSize() > 1) finite = comm::allReduceSum(*backend_, {finite ? 0.0 : 1.0})[0] == 0.0;
  return finite;
}

}  // namespace cyxwiz::ddp
