// The process's place in the job: init() builds the backend the config asks for, finalize() takes
// it down. Collectives called before init (or after finalize) fail with a message that says so.
#pragma once

#include <memory>

#include "cyxwiz/comm/backend.h"
#include "cyxwiz/comm/config.h"

namespace cyxwiz::comm {

// Blocks until every rank has joined (or the timeout passes). Errors: InvalidArgument for a bad
// config, BackendError for a backend this build lacks, NetworkError/TimeoutError/StoreError from
// the rendezvous.
void init(const DistributedConfig& config);
void finalize();  // idempotent
bool isInitialized();
// The backend of the current job; DistError when there is none.
std::shared_ptr<Backend> backend(const char* operation);
// The config of the current job; DistError when there is none.
DistributedConfig currentConfig(const char* operation);

}  // namespace cyxwiz::comm
