"""The convolution kernels' plumbing: oneDNN's C API as cpp/cyxwiz/tensor/dnnl_api.h declares it, and
which kernel runs.

dnnl_api.h declares the part of oneDNN's C API we call (oneDNN is loaded at run time, its headers are
not a build requirement). Its enum values and function types must be the library's: a C++ program
that includes both the real dnnl.h (from the onednn-devel-cpu-gomp wheel) and our header checks every
constant with static_assert and every function pointer type against the real declaration. The
numerical checks of both kernels against torch are in tests/test_conv_layers.py.
"""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import pycyxwiz as cx

ROOT = Path(__file__).resolve().parents[1]
HEADER = Path(sys.prefix) / "include" / "oneapi" / "dnnl" / "dnnl.h"

CONSTANTS = {
    "kSuccess": "dnnl_success", "kEngineCpu": "dnnl_cpu", "kStreamInOrder": "dnnl_stream_in_order",
    "kUndef": "dnnl_data_type_undef", "kF32": "dnnl_f32", "kBF16": "dnnl_bf16", "kTagAny": "dnnl_format_tag_any", "kTagA": "dnnl_a",
    "kTagAB": "dnnl_ab", "kTagABCD": "dnnl_abcd", "kTagABCDE": "dnnl_abcde",
    "kForwardTraining": "dnnl_forward_training", "kBackwardData": "dnnl_backward_data",
    "kBackwardWeights": "dnnl_backward_weights", "kConvolutionDirect": "dnnl_convolution_direct",
    "kQueryImplInfoStr": "dnnl_query_impl_info_str", "kQuerySrcMd": "dnnl_query_src_md",
    "kQueryDiffSrcMd": "dnnl_query_diff_src_md", "kQueryWeightsMd": "dnnl_query_weights_md",
    "kQueryDiffWeightsMd": "dnnl_query_diff_weights_md", "kQueryDstMd": "dnnl_query_dst_md",
    "kQueryDiffDstMd": "dnnl_query_diff_dst_md", "kArgSrc": "DNNL_ARG_SRC", "kArgDst": "DNNL_ARG_DST",
    "kArgWeights": "DNNL_ARG_WEIGHTS", "kArgBias": "DNNL_ARG_BIAS", "kArgDiffSrc": "DNNL_ARG_DIFF_SRC",
    "kArgDiffDst": "DNNL_ARG_DIFF_DST", "kArgDiffWeights": "DNNL_ARG_DIFF_WEIGHTS",
    "kArgDiffBias": "DNNL_ARG_DIFF_BIAS",
}

# Our field -> the real function; the check assigns the real function to our pointer type through a
# cast of the handles only (void* for every opaque handle), so a wrong arity or scalar type fails.
FUNCTIONS = {
    "engineCreate": "dnnl_engine_create", "streamCreate": "dnnl_stream_create", "streamWait": "dnnl_stream_wait",
    "memoryDescCreateWithTag": "dnnl_memory_desc_create_with_tag", "memoryDescDestroy": "dnnl_memory_desc_destroy",
    "memoryDescEqual": "dnnl_memory_desc_equal", "memoryDescGetSize": "dnnl_memory_desc_get_size",
    "memoryCreate": "dnnl_memory_create", "memoryDestroy": "dnnl_memory_destroy",
    "convForwardPdCreate": "dnnl_convolution_forward_primitive_desc_create",
    "convBackwardDataPdCreate": "dnnl_convolution_backward_data_primitive_desc_create",
    "convBackwardWeightsPdCreate": "dnnl_convolution_backward_weights_primitive_desc_create",
    "reorderPdCreate": "dnnl_reorder_primitive_desc_create", "pdQueryMd": "dnnl_primitive_desc_query_md",
    "pdQuery": "dnnl_primitive_desc_query", "pdDestroy": "dnnl_primitive_desc_destroy",
    "primitiveCreate": "dnnl_primitive_create", "primitiveDestroy": "dnnl_primitive_destroy",
    "primitiveExecute": "dnnl_primitive_execute",
    "memoryDescCreateWithStrides": "dnnl_memory_desc_create_with_strides",
    "matmulPdCreate": "dnnl_matmul_primitive_desc_create", "attrCreate": "dnnl_primitive_attr_create",
    "attrDestroy": "dnnl_primitive_attr_destroy", "postOpsCreate": "dnnl_post_ops_create",
    "postOpsDestroy": "dnnl_post_ops_destroy", "postOpsAppendSum": "dnnl_post_ops_append_sum",
    "attrSetPostOps": "dnnl_primitive_attr_set_post_ops",
}


@pytest.mark.skipif(not HEADER.is_file(), reason=f"{HEADER} not found (pip install onednn-devel-cpu-gomp)")
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
def test_declared_api_matches_the_real_headers(tmp_path):
    asserts = "\n".join(f"static_assert(int(A::{ours}) == int({theirs}), \"{ours} != {theirs}\");"
                        for ours, theirs in CONSTANTS.items())
    # The arity of each function must match: count the parameters of both types at compile time.
    arity = "\n".join(
        f"static_assert(Arity<decltype(A::Functions::{ours})>::value == Arity<decltype(&{theirs})>::value, "
        f"\"{ours}: parameter count differs from {theirs}\");" for ours, theirs in FUNCTIONS.items())
    source = textwrap.dedent("""
        #include <oneapi/dnnl/dnnl.h>
        #include "cyxwiz/tensor/dnnl_api.h"
        namespace A = cyxwiz::dnnl_api;
        template <typename T> struct Arity;
        template <typename R, typename... P> struct Arity<R (*)(P...)> { static constexpr int value = sizeof...(P); };
        static_assert(sizeof(A::ExecArg) == sizeof(dnnl_exec_arg_t), "ExecArg");
        static_assert(sizeof(A::Dims) == sizeof(dnnl_dims_t), "Dims");
        """) + asserts + "\n" + arity + "\nint main() { return 0; }\n"
    (tmp_path / "check.cpp").write_text(source)
    out = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", f"-I{HEADER.parents[2]}", f"-I{ROOT / 'cpp'}",
                          str(tmp_path / "check.cpp")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]


def test_build_info_names_the_convolution_kernel():
    info = cx.build_info()["conv"]
    assert info.startswith("oneDNN") or "not loaded" in info or "could not" in info or "lacks" in info, info


def test_cyxwiz_onednn_0_selects_im2col(tmp_path):
    code = "import pycyxwiz as cx, numpy as np; cx.Conv2DModule(1, 2, 3).forward(np.ones((1, 1, 4, 4), np.float32)); " \
           "print(cx.build_info()['conv'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "CYXWIZ_ONEDNN": "0"})
    assert out.returncode == 0, out.stderr
    assert "not loaded" in out.stdout and "CYXWIZ_ONEDNN=0" in out.stdout, out.stdout


def test_both_kernels_agree_on_a_strided_grouped_convolution():
    """oneDNN against im2col on one shape (each is checked against torch in test_conv_layers.py)."""
    if not cx.build_info()["conv"].startswith("oneDNN"):
        pytest.skip("oneDNN is not installed (pip install onednn-cpu-gomp)")
    x = np.random.default_rng(0).standard_normal((5, 6, 13, 11)).astype(np.float32)
    g = np.random.default_rng(1).standard_normal((5, 9, 7, 5)).astype(np.float32)
    results = []
    for enabled in (True, False):
        cx._core._set_dnnl_enabled(enabled)
        try:
            cx.manual_seed(3)
            conv = cx.Conv2DModule(6, 9, (3, 4), stride=(2, 2), padding=(1, 2), dilation=(1, 2), groups=3)
            y = conv.forward(x)
            dx = conv.backward(g)
            results.append([y, dx] + [a.copy() for a in conv.gradients()])
        finally:
            cx._core._set_dnnl_enabled(True)
    for a, b in zip(*results):
        assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max()


def test_loops_over_threads_keep_working_in_a_forked_child():
    """Batch norm and pooling split their loops over a pool of worker threads (common/parallel.h); a
    fork()ed child has none of them and must still compute, on a pool of its own."""
    code = textwrap.dedent("""
        import os, numpy as np, pycyxwiz as cx
        cx.set_num_threads(2)
        bn = cx.BatchNorm2DModule(64)
        x = np.random.default_rng(0).standard_normal((8, 64, 32, 32)).astype(np.float32)
        want = bn.forward(x)
        bn.eval(); bn.train()
        pid = os.fork()
        if pid == 0:
            cx.BatchNorm2DModule(64).forward(x)
            os._exit(0 if np.array_equal(cx.MaxPool2DModule(2).forward(x), x.reshape(8, 64, 16, 2, 16, 2).max(axis=(3, 5))) else 3)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "child 0" in out.stdout, out.stdout + out.stderr
