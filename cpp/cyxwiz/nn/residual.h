// ResidualModule: y = body(x) + shortcut(x) for an input of any shape, (N, C, H, W) in a ResNet; body
// and shortcut must give the same shape (checked at construction where known, and on every input). The
// shortcut is the identity when none is given, so that a
// ResNet is a SequentialModel. Parameters and buffers are the body's then the shortcut's, named
// "body.0.weight", "shortcut.0.weight" (torch's names for submodules called body and shortcut).
#pragma once

#include <memory>

#include "cyxwiz/nn/sequential.h"

namespace cyxwiz::nn {

class ResidualModule : public Module {
 public:
  explicit ResidualModule(std::shared_ptr<SequentialModel> body, std::shared_ptr<SequentialModel> shortcut = nullptr);
  // From the layers a model file stores; `unused` keeps the factory's call shape.
  static std::shared_ptr<ResidualModule> fromLayers(const std::vector<std::shared_ptr<Module>>& body,
                                                    const std::vector<std::shared_ptr<Module>>& shortcut, bool unused);

  std::string typeName() const override { return "ResidualModule"; }
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  std::vector<Parameter*> parameters() override;
  std::vector<std::pair<std::string, Parameter*>> namedParameters() override;
  std::vector<Buffer*> buffers() override;
  std::vector<std::pair<std::string, Buffer*>> namedBuffers() override;
  ModuleSpec spec() const override;
  std::vector<std::shared_ptr<Module>> children() const override;
  std::string repr() const override;
  Shape outputShape(const Shape& input) const override;
  bool runsOnGpu() const override;  // when every layer of the body and the shortcut does
  void to(const Device& device) override;
  void setTraining(bool training) override;

  const std::shared_ptr<SequentialModel>& body() const { return body_; }
  const std::shared_ptr<SequentialModel>& shortcut() const { return shortcut_; }  // null: the identity

 protected:
  void clearCache() override;

 private:
  std::shared_ptr<SequentialModel> body_, shortcut_;
  Shape outShape_;  // of the last forward: what backward expects; empty before it
};

}  // namespace cyxwiz::nn
