// Layers and SequentialModel. Arrays convert at the boundary; the GIL is released while the engine computes.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cyxwiz/nn/activations.h"
#include "cyxwiz/nn/attention.h"
#include "cyxwiz/nn/batchnorm.h"
#include "cyxwiz/nn/conv2d.h"
#include "cyxwiz/nn/dropout.h"
#include "cyxwiz/nn/embedding.h"
#include "cyxwiz/nn/layernorm.h"
#include "cyxwiz/nn/pool2d.h"
#include "cyxwiz/nn/positional.h"
#include "cyxwiz/nn/residual.h"
#include "cyxwiz/nn/gelu.h"
#include "cyxwiz/nn/generate.h"
#include "cyxwiz/nn/linear.h"
#include "cyxwiz/nn/relu.h"
#include "cyxwiz/nn/sequential.h"
#include "cyxwiz/nn/sigmoid.h"
#include "cyxwiz/nn/softmax.h"
#include "cyxwiz/nn/tanh.h"
#include "cyxwiz/nn/transformer.h"
#include "cyxwiz/device/cuda.h"
#include "gil.h"
#include "numpy_convert.h"

namespace py = pybind11;
using namespace cyxwiz::nn;
using cyxwiz::Tensor;
using cyxwiz::bindings::floatTensor;
using cyxwiz::bindings::toNumpy;
using cyxwiz::bindings::toPython;

namespace {

template <typename Params>
py::list valueViews(const Params& params) {
  py::list out;
  for (Parameter* p : params) out.append(toNumpy(p->value));
  return out;
}

template <typename Params>
py::list gradViews(const Params& params) {
  py::list out;
  for (Parameter* p : params) out.append(toNumpy(p->grad));
  return out;
}

// An int or a (height, width) pair, as torch's kernel_size/stride/padding arguments.
Pair toPair(py::handle v, const char* what) {
  if (py::isinstance<py::int_>(v)) {
    int64_t k = v.cast<int64_t>();
    return {k, k};
  }
  auto seq = v.cast<std::vector<int64_t>>();
  if (seq.size() != 2) throw py::value_error(std::string(what) + " must be an int or a pair (height, width)");
  return {seq[0], seq[1]};
}

py::tuple pairTuple(const Pair& p) { return py::make_tuple(p[0], p[1]); }

template <typename Named>
py::list namedViews(const Named& named) {
  py::list out;
  for (const auto& [name, item] : named) out.append(py::make_tuple(name, toNumpy(item->value)));
  return out;
}

// A model's (or module's) input shape for summary/output_shape: an int is a feature count; a tuple is
// one sample's shape; the batch comes first as unknown.
cyxwiz::Shape sampleShape(py::handle v) {
  if (v.is_none()) return {};
  if (py::isinstance<py::int_>(v)) return {-1, v.cast<int64_t>()};
  cyxwiz::Shape shape{-1};
  for (int64_t d : v.cast<std::vector<int64_t>>()) shape.push_back(d);
  return shape;
}

py::tuple shapeTuple(const cyxwiz::Shape& shape) {
  py::list out;
  for (int64_t d : shape) {
    if (d < 0) out.append(py::none()); else out.append(d);
  }
  return py::tuple(out);
}

std::shared_ptr<SequentialModel> asModel(py::handle v) {
  if (py::isinstance<SequentialModel>(v)) return v.cast<std::shared_ptr<SequentialModel>>();
  auto model = std::make_shared<SequentialModel>();
  model->add(v.cast<std::shared_ptr<Module>>());
  return model;
}

// MaxPool2DModule / AvgPool2DModule(pool_size, stride=None, padding=0).
template <typename P>
auto poolInit() {
  return py::init([](py::handle pool, py::handle stride, py::handle padding) {
    return std::make_shared<P>(toPair(pool, "pool_size"), stride.is_none() ? Pair{0, 0} : toPair(stride, "stride"),
                               toPair(padding, "padding"));
  });
}

constexpr const char* kViewsNote =
    " Numpy views of the live buffers: writing to them changes the model (host copies for a model on a GPU).";

}  // namespace

void init_nn(py::module_& m) {
  py::class_<Module, std::shared_ptr<Module>>(m, "Module", "Base class of every layer.")
      .def("forward", [](Module& self, py::handle x) {
        Tensor in = cyxwiz::bindings::modelInput(x, self.takesIndices(), (self.typeName() + ".forward").c_str());
        Tensor out;
        { cyxwiz::bindings::BlockingCall unlocked; out = self.forward(in); }
        return toPython(out);
      }, py::arg("input"))
      .def("__call__", [](py::object self, py::handle x) { return self.attr("forward")(x); }, py::arg("input"))
      .def("backward", [](Module& self, py::handle g) {
        Tensor grad = floatTensor(g, (self.typeName() + ".backward").c_str());
        Tensor out;
        { cyxwiz::bindings::BlockingCall unlocked; self.setNeedInputGrad(true); out = self.backward(grad); }
        return toPython(out);
      }, py::arg("grad_output"), "Accumulates parameter gradients; returns the gradient w.r.t. the input.")
      .def("parameters", [](Module& self) { return valueViews(self.parameters()); },
           (std::string("Weights then bias.") + kViewsNote).c_str())
      .def("gradients", [](Module& self) { return gradViews(self.parameters()); },
           (std::string("Gradients, in parameters() order.") + kViewsNote).c_str())
      .def("zero_grad", &Module::zeroGrad)
      .def("num_parameters", &Module::numParameters)
      .def("named_parameters", [](Module& self) { return namedViews(self.namedParameters()); })
      .def("buffers", [](Module& self) {
        py::list out;
        for (Buffer* b : self.buffers()) out.append(toNumpy(b->value));
        return out;
      }, "Running statistics (BatchNorm); numpy views of the live buffers.")
      .def("named_buffers", [](Module& self) { return namedViews(self.namedBuffers()); })
      .def("output_shape", [](const Module& self, py::handle shape) { return shapeTuple(self.outputShape(sampleShape(shape))); },
           py::arg("input_shape"), "The output shape (None for the batch) for one sample of input_shape.")
      .def("_saved_tensors", [](const Module& self) {
        py::list out;
        for (const Tensor& t : self.savedTensors()) {
          py::dict d;
          d["dtype"] = cyxwiz::dtypeName(t.dtype());
          d["shape"] = py::tuple(py::cast(t.shape()));
          d["nbytes"] = t.nbytes();
          d["data_ptr"] = reinterpret_cast<uintptr_t>(t.rawData());
          out.append(d);
        }
        return out;
      }, "What forward kept for backward: dtype, shape, nbytes, data_ptr of each (LinearModule, ReLUModule).")
      .def("train", [](Module& self) { self.setTraining(true); })
      .def("eval", [](Module& self) { self.setTraining(false); })
      .def_property_readonly("training", &Module::training)
      .def("__repr__", &Module::repr);

  py::class_<LinearModule, Module, std::shared_ptr<LinearModule>>(m, "LinearModule",
      "y = x W^T + b with W of shape (out_features, in_features); Kaiming-uniform init as torch.nn.Linear.")
      .def(py::init<int64_t, int64_t, bool>(), py::arg("in_features"), py::arg("out_features"), py::arg("bias") = true)
      .def_property_readonly("in_features", [](const LinearModule& l) { return l.inFeatures(); })
      .def_property_readonly("out_features", [](const LinearModule& l) { return l.outFeatures(); })
      .def_property_readonly("bias", &LinearModule::hasBias);
  py::class_<ReLUModule, Module, std::shared_ptr<ReLUModule>>(m, "ReLUModule").def(py::init<>());

  py::class_<Conv2DModule, Module, std::shared_ptr<Conv2DModule>>(m, "Conv2DModule", R"pbdoc(
2-D convolution over (N, C, H, W), as torch.nn.Conv2d: weight (out_channels, in_channels / groups, kh, kw),
bias (out_channels); kernel_size, stride, padding and dilation are an int or a (height, width) pair.
)pbdoc")
      .def(py::init([](int64_t in, int64_t out, py::handle kernel, py::handle stride, py::handle padding,
                       py::handle dilation, int64_t groups, bool bias) {
             return std::make_shared<Conv2DModule>(in, out, toPair(kernel, "kernel_size"), toPair(stride, "stride"),
                                                   toPair(padding, "padding"), toPair(dilation, "dilation"), groups, bias);
           }),
           py::arg("in_channels"), py::arg("out_channels"), py::arg("kernel_size"), py::arg("stride") = 1,
           py::arg("padding") = 0, py::arg("dilation") = 1, py::arg("groups") = 1, py::arg("use_bias") = true)
      .def_property_readonly("in_channels", &Conv2DModule::inChannels)
      .def_property_readonly("out_channels", &Conv2DModule::outChannels)
      .def_property_readonly("kernel_size", [](const Conv2DModule& c) { return pairTuple(c.kernelSize()); })
      .def_property_readonly("stride", [](const Conv2DModule& c) { return pairTuple(c.stride()); })
      .def_property_readonly("padding", [](const Conv2DModule& c) { return pairTuple(c.padding()); })
      .def_property_readonly("dilation", [](const Conv2DModule& c) { return pairTuple(c.dilation()); })
      .def_property_readonly("groups", &Conv2DModule::groups);

  py::class_<Pool2DModule, Module, std::shared_ptr<Pool2DModule>>(m, "_Pool2DModule")
      .def_property_readonly("pool_size", [](const Pool2DModule& p) { return pairTuple(p.poolSize()); })
      .def_property_readonly("stride", [](const Pool2DModule& p) { return pairTuple(p.stride()); })
      .def_property_readonly("padding", [](const Pool2DModule& p) { return pairTuple(p.padding()); });
  py::class_<MaxPool2DModule, Pool2DModule, std::shared_ptr<MaxPool2DModule>>(m, "MaxPool2DModule",
      "Max pooling over (N, C, H, W), as torch.nn.MaxPool2d; stride=None means pool_size.")
      .def(poolInit<MaxPool2DModule>(), py::arg("pool_size"), py::arg("stride") = py::none(), py::arg("padding") = 0);
  py::class_<AvgPool2DModule, Pool2DModule, std::shared_ptr<AvgPool2DModule>>(m, "AvgPool2DModule",
      "Average pooling over (N, C, H, W), as torch.nn.AvgPool2d (the zero padding counts); stride=None means pool_size.")
      .def(poolInit<AvgPool2DModule>(), py::arg("pool_size"), py::arg("stride") = py::none(), py::arg("padding") = 0);
  py::class_<GlobalAvgPool2DModule, Module, std::shared_ptr<GlobalAvgPool2DModule>>(m, "GlobalAvgPool2DModule",
      "(N, C, H, W) -> (N, C): the mean of each channel's plane.")
      .def(py::init<>());
  py::class_<FlattenModule, Module, std::shared_ptr<FlattenModule>>(m, "FlattenModule",
      "(N, d1, d2, ...) -> (N, d1 * d2 * ...), as torch.nn.Flatten().")
      .def(py::init<>());

  py::class_<BatchNormModule, Module, std::shared_ptr<BatchNormModule>>(m, "_BatchNormModule")
      .def_property_readonly("num_features", &BatchNormModule::numFeatures)
      .def_property_readonly("eps", &BatchNormModule::eps)
      .def_property_readonly("momentum", &BatchNormModule::momentum)
      .def_property_readonly("sync", &BatchNormModule::synchronized,
                             "True after cx.distributed.convert_sync_batchnorm: statistics over every rank's rows.");
  py::class_<BatchNorm1DModule, BatchNormModule, std::shared_ptr<BatchNorm1DModule>>(m, "BatchNorm1DModule",
      "Batch normalisation over (N, C) or (N, C, L), as torch.nn.BatchNorm1d.")
      .def(py::init<int64_t, double, double>(), py::arg("num_features"), py::arg("eps") = 1e-5, py::arg("momentum") = 0.1);
  py::class_<BatchNorm2DModule, BatchNormModule, std::shared_ptr<BatchNorm2DModule>>(m, "BatchNorm2DModule",
      "Batch normalisation over (N, C, H, W), as torch.nn.BatchNorm2d: running_mean, running_var and "
      "num_batches_tracked are buffers.")
      .def(py::init<int64_t, double, double>(), py::arg("num_features"), py::arg("eps") = 1e-5, py::arg("momentum") = 0.1);

  py::class_<LayerNormModule, Module, std::shared_ptr<LayerNormModule>>(m, "LayerNormModule",
      "Normalisation over the trailing dimensions normalized_shape (an int or a tuple), as torch.nn.LayerNorm.")
      .def(py::init([](py::object shape, double eps) {
             cyxwiz::Shape s;
             if (py::isinstance<py::int_>(shape)) {
               s.push_back(shape.cast<int64_t>());
             } else {
               for (py::handle d : shape) s.push_back(d.cast<int64_t>());
             }
             return std::make_shared<LayerNormModule>(s, eps);
           }),
           py::arg("normalized_shape"), py::arg("eps") = 1e-5)
      .def_property_readonly("normalized_shape", [](const LayerNormModule& l) {
        py::tuple t(l.normalizedShape().size());
        for (size_t i = 0; i < l.normalizedShape().size(); ++i) t[i] = l.normalizedShape()[i];
        return t;
      })
      .def_property_readonly("eps", &LayerNormModule::eps);
  py::class_<EmbeddingModule, Module, std::shared_ptr<EmbeddingModule>>(m, "EmbeddingModule",
      "Token ids (N, T) of any integer dtype -> (N, T, embedding_dim) rows of a table, as torch.nn.Embedding.")
      .def(py::init<int64_t, int64_t>(), py::arg("num_embeddings"), py::arg("embedding_dim"))
      .def_property_readonly("num_embeddings", &EmbeddingModule::numEmbeddings)
      .def_property_readonly("embedding_dim", &EmbeddingModule::embeddingDim);
  py::class_<PositionalEncodingModule, Module, std::shared_ptr<PositionalEncodingModule>>(m, "PositionalEncodingModule",
      "Adds sinusoidal (the Transformer paper's) or learned position vectors to (N, T, dim) embeddings.")
      .def(py::init<int64_t, int64_t, bool>(), py::arg("max_len"), py::arg("dim"), py::arg("learned") = false)
      .def_property_readonly("max_len", &PositionalEncodingModule::maxLen)
      .def_property_readonly("dim", &PositionalEncodingModule::dim)
      .def_property_readonly("learned", &PositionalEncodingModule::learned);
  py::class_<MultiHeadAttentionModule, Module, std::shared_ptr<MultiHeadAttentionModule>>(m, "MultiHeadAttentionModule",
      "Self-attention over (N, T, embed_dim), as torch.nn.MultiheadAttention(batch_first=True) with query = key = "
      "value; causal=True masks the keys after each query.")
      .def(py::init<int64_t, int64_t, bool, double, bool>(), py::arg("embed_dim"), py::arg("num_heads"),
           py::arg("causal") = false, py::arg("dropout") = 0.0, py::arg("bias") = true)
      .def_property_readonly("embed_dim", &MultiHeadAttentionModule::embedDim)
      .def_property_readonly("num_heads", &MultiHeadAttentionModule::numHeads)
      .def_property_readonly("causal", &MultiHeadAttentionModule::causal)
      .def_property_readonly("dropout", &MultiHeadAttentionModule::dropout);
  py::class_<TransformerEncoderModule, Module, std::shared_ptr<TransformerEncoderModule>>(m, "TransformerEncoderModule",
      "One Transformer encoder block over (N, T, d_model), as torch.nn.TransformerEncoderLayer(batch_first=True); "
      "norm_first=True is the pre-norm block, causal=True masks the keys after each query.")
      .def(py::init<int64_t, int64_t, int64_t, double, const std::string&, bool, bool, double>(), py::arg("d_model"),
           py::arg("nhead"), py::arg("dim_feedforward") = 2048, py::arg("dropout") = 0.1, py::arg("activation") = "gelu",
           py::arg("causal") = false, py::arg("norm_first") = true, py::arg("layer_norm_eps") = 1e-5);
  py::class_<LeakyReLUModule, Module, std::shared_ptr<LeakyReLUModule>>(m, "LeakyReLUModule")
      .def(py::init<double>(), py::arg("negative_slope") = 0.01)
      .def_property_readonly("negative_slope", &LeakyReLUModule::negativeSlope);
  py::class_<ELUModule, Module, std::shared_ptr<ELUModule>>(m, "ELUModule")
      .def(py::init<double>(), py::arg("alpha") = 1.0)
      .def_property_readonly("alpha", &ELUModule::alpha);
  py::class_<SwishModule, Module, std::shared_ptr<SwishModule>>(m, "SwishModule", "x * sigmoid(x) (torch's SiLU).")
      .def(py::init<>());
  py::class_<MishModule, Module, std::shared_ptr<MishModule>>(m, "MishModule", "x * tanh(softplus(x)).")
      .def(py::init<>());
  py::class_<SigmoidModule, Module, std::shared_ptr<SigmoidModule>>(m, "SigmoidModule").def(py::init<>());
  py::class_<TanhModule, Module, std::shared_ptr<TanhModule>>(m, "TanhModule").def(py::init<>());
  py::class_<GELUModule, Module, std::shared_ptr<GELUModule>>(m, "GELUModule", "Exact (erf) GELU.").def(py::init<>());
  py::class_<SoftmaxModule, Module, std::shared_ptr<SoftmaxModule>>(m, "SoftmaxModule", "Softmax over the last axis.")
      .def(py::init<>());
  py::class_<DropoutModule, Module, std::shared_ptr<DropoutModule>>(m, "DropoutModule",
      "Inverted dropout in train mode, identity in eval mode.")
      .def(py::init<double>(), py::arg("p") = 0.5)
      .def_property_readonly("p", &DropoutModule::p);

  py::class_<SequentialModel, std::shared_ptr<SequentialModel>>(m, "SequentialModel", R"pbdoc(
Layers applied in order. ``forward`` caches what ``backward`` needs; ``backward`` adds into the
gradients (call ``zero_grad`` between steps, or don't, to accumulate).
)pbdoc")
      .def(py::init<>())
      .def("add", &SequentialModel::add, py::arg("module"))
      .def("forward", [](SequentialModel& self, py::handle x) {
        Tensor in = cyxwiz::bindings::modelInput(x, self.takesIndices(), "SequentialModel.forward");
        Tensor out;
        { cyxwiz::bindings::BlockingCall unlocked; out = self.forward(in); }
        return toPython(out);
      }, py::arg("input"))
      .def("__call__", [](py::object self, py::handle x) { return self.attr("forward")(x); }, py::arg("input"))
      .def("backward", [](SequentialModel& self, py::handle g, bool inputGrad) {
        Tensor grad = floatTensor(g, "SequentialModel.backward");
        Tensor out;
        { cyxwiz::bindings::BlockingCall unlocked; out = self.backward(grad, inputGrad); }
        return toPython(out);
      }, py::arg("grad_output"), py::arg("input_grad") = false,
         "Accumulates parameter gradients. Returns the gradient w.r.t. the model input when input_grad=True, else None.")
      .def("to", [](std::shared_ptr<SequentialModel> self, const std::string& device) {
        cyxwiz::Device d = cyxwiz::device::parseDevice(device);
        { cyxwiz::bindings::BlockingCall unlocked; self->to(d); }
        return self;
      }, py::arg("device"), R"pbdoc(
Moves the parameters to "cpu", "cuda" or "cuda:N" and returns the model. numpy inputs are then copied
to that device in forward; outputs and gradients stay there as cx.Tensor (np.asarray copies them back).
)pbdoc")
      .def_property_readonly("device", [](const SequentialModel& self) { return self.device().str(); })
      .def("zero_grad", &SequentialModel::zeroGrad, py::call_guard<cyxwiz::bindings::BlockingCall>())
      .def("parameters", [](const SequentialModel& self) { return valueViews(self.parameters()); },
           (std::string("Weights then bias, layer by layer.") + kViewsNote).c_str())
      .def("gradients", [](const SequentialModel& self) {
        { cyxwiz::bindings::BlockingCall unlocked; self.guardGradients(SequentialModel::GradientUse::Read); }
        return gradViews(self.parameters());
      },
           (std::string("Gradients, in parameters() order.") + kViewsNote).c_str())
      .def("named_parameters", [](const SequentialModel& self) { return namedViews(self.namedParameters()); },
           "[(\"0.weight\", array), ...] in parameters() order (torch's state_dict names).")
      .def("buffers", [](const SequentialModel& self) {
        py::list out;
        for (Buffer* b : self.buffers()) out.append(toNumpy(b->value));
        return out;
      }, (std::string("BatchNorm's running_mean, running_var, num_batches_tracked, layer by layer: saved with the "
                      "model, never stepped by an optimizer.") + kViewsNote).c_str())
      .def("named_buffers", [](const SequentialModel& self) { return namedViews(self.namedBuffers()); },
           "[(\"1.running_mean\", array), ...] in buffers() order (torch's state_dict names).")
      .def("output_shape", [](const SequentialModel& self, py::handle shape) { return shapeTuple(self.outputShape(sampleShape(shape))); },
           py::arg("input_shape"), R"pbdoc(
The model's output shape for one sample of input_shape (an int: a feature count; a tuple such as
(1, 28, 28)); the batch is None. Raises ValueError naming the layer that does not take its input.
)pbdoc")
      .def("num_parameters", &SequentialModel::numParameters)
      .def("train", &SequentialModel::train)
      .def("eval", &SequentialModel::eval)
      .def_property_readonly("training", &SequentialModel::training)
      .def("set_gradient_checkpointing", [](SequentialModel& self, py::handle segments) {
        // True would mean one segment, which recomputes nothing: ask for the number instead.
        if (PyBool_Check(segments.ptr())) {
          throw py::type_error("set_gradient_checkpointing(segments): segments is a number of segments "
                               "(2 or more; 0 turns checkpointing off), not a bool");
        }
        self.setGradientCheckpointing(segments.cast<int>());
      }, py::arg("segments"), R"pbdoc(
Gradient checkpointing, as torch.utils.checkpoint.checkpoint_sequential(functions, segments, input):
with segments=k >= 2, a training forward splits the layers into k contiguous segments of near-equal
size and keeps only each segment's input; backward recomputes each segment's forward from it (the last
segment keeps its caches). Less activation memory for about one more forward; the gradients are
bit-identical (Dropout redraws the same masks). 0 turns it off (the default); 1 is one segment, nothing
recomputed. A LinearModule and the ReLUModule after it stay in one segment, so asking more segments
than that forms one per pair or layer. eval() forwards are unaffected; not saved in model files.
)pbdoc")
      .def_property_readonly("gradient_checkpointing", &SequentialModel::gradientCheckpointing,
                             "The segments set by set_gradient_checkpointing (0: off).")
      .def("generate", [](SequentialModel& self, py::handle prompt, int64_t maxNewTokens, double temperature,
                          std::optional<int64_t> topK, uint64_t seed, bool useCache) {
        const Tensor ids = cyxwiz::bindings::modelInput(prompt, true, "generate prompt_ids");
        Tensor out;
        { cyxwiz::bindings::BlockingCall unlocked; out = generate(self, ids, maxNewTokens, temperature, topK, seed, useCache); }
        return toNumpy(out);
      }, py::arg("prompt_ids"), py::arg("max_new_tokens"), py::arg("temperature") = 1.0, py::arg("top_k") = py::none(),
         py::arg("seed") = 0, py::arg("use_cache") = true,
         "A causal language model's continuation of prompt_ids ((T,) or (N, T) ints): (N, T + max_new_tokens) ids, "
         "sampled from softmax(logits / temperature) (the top_k largest when given; temperature 0: argmax).\n"
         "use_cache: a CPU model of causal blocks keeps each token's keys and values and runs one new token a step.")
      .def("summary", [](const SequentialModel& self, py::handle in) { return self.summary(sampleShape(in)); },
           py::arg("input_shape") = py::none(),
           "A table of the layers, their output shapes and parameter counts; input_shape: an int (features) or "
           "one sample's shape such as (3, 32, 32).")
      .def("save", &SequentialModel::save, py::arg("path"), py::call_guard<cyxwiz::bindings::BlockingCall>(),
           "Write a .cyxmodel file atomically (temp file + rename).")
      .def_static("load", &SequentialModel::load, py::arg("path"), py::call_guard<cyxwiz::bindings::BlockingCall>(),
                  "Read a .cyxmodel file; a corrupt, truncated or foreign file raises cx.ModelFormatError.")
      .def("__len__", &SequentialModel::size)
      .def("__getitem__", [](const SequentialModel& self, int64_t i) {
        int64_t n = static_cast<int64_t>(self.size());
        return self.at(static_cast<size_t>(i < 0 ? i + n : i));
      })
      .def("__repr__", &SequentialModel::repr);

  py::class_<ResidualModule, Module, std::shared_ptr<ResidualModule>>(m, "ResidualModule", R"pbdoc(
y = body(x) + shortcut(x); the shortcut is the identity when None. body and shortcut are a
SequentialModel or a single module. Parameters are named body.0.weight, ..., shortcut.0.weight.
)pbdoc")
      .def(py::init([](py::handle body, py::handle shortcut) {
             return std::make_shared<ResidualModule>(asModel(body), shortcut.is_none() ? nullptr : asModel(shortcut));
           }),
           py::arg("body"), py::arg("shortcut") = py::none())
      .def_property_readonly("body", &ResidualModule::body)
      .def_property_readonly("shortcut", &ResidualModule::shortcut);
}
