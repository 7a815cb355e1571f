"""pycyxwiz: a data-parallel training engine with a C++ core.

    import pycyxwiz as cx
    model = cx.SequentialModel()
    model.add(cx.LinearModule(784, 256)); model.add(cx.ReLUModule()); model.add(cx.LinearModule(256, 10))
"""

import ctypes as _ctypes
import os as _os

import scipy_openblas32 as _openblas

# _core finds the BLAS through its rpath when both live in one site-packages; loading it here by
# path also covers editable installs and unusual layouts (the loader matches it by soname).
if _os.name == "nt":  # no rpath: libscipy_openblas.dll's folder joins the search path of _core.pyd's DLLs
    _os.add_dll_directory(_os.path.normpath(_openblas.get_lib_dir()))  # get_library(True) is the .lib there
else:
    _ctypes.CDLL(_os.path.join(_openblas.get_lib_dir(), _openblas.get_library(True)), mode=_ctypes.RTLD_GLOBAL)

from ._core import (  # noqa: F401
    AdamOptimizer,
    AdamWOptimizer,
    AvgPool2DModule,
    BatchNorm1DModule,
    BatchNorm2DModule,
    Conv2DModule,
    CrossEntropyLoss,
    DropoutModule,
    ELUModule,
    EmbeddingModule,
    FlattenModule,
    GELUModule,
    GlobalAvgPool2DModule,
    GradScaler,
    LayerNormModule,
    LeakyReLUModule,
    LinearModule,
    Loss,
    MaxPool2DModule,
    MishModule,
    ModelFormatError,
    Module,
    MSELoss,
    MultiHeadAttentionModule,
    Optimizer,
    PositionalEncodingModule,
    ReLUModule,
    ResidualModule,
    SequentialModel,
    SGDOptimizer,
    SigmoidModule,
    SoftmaxModule,
    SwishModule,
    TanhModule,
    TransformerEncoderModule,
    Tensor,
    __version__,
    accuracy,
    autocast,
    build_info,
    cuda,
    empty_cache,
    from_dlpack,
    get_autocast_dtype,
    get_num_threads,
    get_rng_state,
    host_memory_stats,
    is_autocast_enabled,
    manual_seed,
    set_num_threads,
    set_rng_state,
)
from ._core import _configure_host_cache, _configure_threads, _set_blas16_library, _set_blas16_provider, _set_dnnl_library
from . import distributed  # noqa: F401,E402

_configure_threads()  # BLAS threads: see docs/engine.md "Threads and randomness"
_configure_host_cache()  # reads CYXWIZ_HOST_CACHE: see docs/engine.md "Memory"


def _mkl_runtime():
    """oneMKL's runtime library from the `mkl` wheel, for autocast("bfloat16")'s products on the CPU
    (docs/engine.md, "Mixed precision"); "" when it is not installed or CYXWIZ_MKL=0. Opened at first use."""
    if _os.environ.get("CYXWIZ_MKL", "1").strip().lower() in ("0", "false", "no", "off"):
        return ""
    import glob as _glob
    import sys as _sys

    found = sorted(_glob.glob(_os.path.join(_sys.prefix, "lib", "libmkl_rt.so.*")))  # the Linux wheel's layout
    return found[-1] if found else ""


_set_blas16_library(_mkl_runtime())


def _onednn_runtime():
    """oneDNN's library from the `onednn-cpu-gomp` wheel, for the convolutions' kernels (docs/engine.md,
    "Shapes"); "" when it is not installed or CYXWIZ_ONEDNN=0. Opened at the first convolution."""
    if _os.environ.get("CYXWIZ_ONEDNN", "1").strip().lower() in ("0", "false", "no", "off"):
        return ""
    import glob as _glob
    import sys as _sys

    found = sorted(_glob.glob(_os.path.join(_sys.prefix, "lib", "libdnnl.so.3*")))  # the Linux wheel's layout
    return found[0] if found else ""


_set_dnnl_library(_onednn_runtime())
# Who computes autocast("bfloat16")'s products on the CPU: measured at the first one (default), or forced.
_set_blas16_provider(_os.environ.get("CYXWIZ_BF16_GEMM", "auto").strip().lower() or "auto")
